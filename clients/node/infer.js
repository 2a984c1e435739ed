// A Halcyon client in Node, as a user writes it: proto/halcyon/v1/infer.proto loaded at run time
// with @grpc/proto-loader, the published gRPC service config (clients/service_config.json, whose
// retryPolicy and retryThrottling @grpc/grpc-js applies, honouring grpc-retry-pushback-ms), and
// the rich error model read back: the grpc-status-details-bin trailer decoded as a
// google.rpc.Status and its ErrorInfo / RetryInfo / BadRequest details printed.
//
// Usage: node infer.js [TARGET [API_KEY [MAX_OUTPUT_TOKENS]]]
// (defaults 127.0.0.1:50051, demo-key-premium, 64). Exit 0 on an answer, 1 on an error.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const [target = '127.0.0.1:50051', apiKey = 'demo-key-premium', tokens = '64'] =
  process.argv.slice(2);
const PROTO_DIR = path.join(__dirname, '..', '..', 'proto');
const serviceConfig = fs.readFileSync(path.join(__dirname, '..', 'service_config.json'), 'utf8');

// The service, from the repository's contract (no generated code).
const definition = protoLoader.loadSync(path.join(PROTO_DIR, 'halcyon', 'v1', 'infer.proto'), {
  includeDirs: [PROTO_DIR],
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
});
const { InferService } = grpc.loadPackageDefinition(definition).halcyon.v1;

// google.rpc.Status and its details: Google's own .proto files (vendored under protos/, licence
// intact); google/protobuf/{any,duration}.proto come with protobufjs.
const rpcTypes = new protobuf.Root().loadSync(
  ['status.proto', 'error_details.proto'].map((f) => path.join(__dirname, 'protos', 'google', 'rpc', f)),
  { keepCase: true },
);
const Status = rpcTypes.lookupType('google.rpc.Status');

function richDetails(err) {
  const [bin] = err.metadata ? err.metadata.get('grpc-status-details-bin') : [];
  if (!bin) return [];
  return Status.decode(bin).details.map((any) => {
    const type = rpcTypes.lookupType(any.type_url.slice(any.type_url.lastIndexOf('/') + 1));
    return { type: type.fullName.slice(1), ...type.toObject(type.decode(any.value), { longs: Number }) };
  });
}

const client = new InferService(target, grpc.credentials.createInsecure(), {
  'grpc.service_config': serviceConfig,
  'grpc.enable_retries': 1,
});
const metadata = new grpc.Metadata();
metadata.set('x-api-key', apiKey);
const request = { model: 'llama-3-8b', input: 'hello', max_output_tokens: Number(tokens) };

client.Infer(request, metadata, { deadline: Date.now() + 10_000 }, (err, reply) => {
  client.close();
  if (!err) {
    console.log(reply.output);
    return;
  }
  const code = Object.keys(grpc.status).find((name) => grpc.status[name] === err.code);
  console.log(`${code}: ${err.details}`);
  for (const detail of richDetails(err)) {
    if (detail.type === 'google.rpc.ErrorInfo') {
      console.log(`reason: ${detail.reason} ${JSON.stringify(detail.metadata || {})}`);
    } else if (detail.type === 'google.rpc.RetryInfo') {
      const delay = detail.retry_delay || {};
      const ms = (delay.seconds || 0) * 1000 + (delay.nanos || 0) / 1e6;
      console.log(`retry after: ${Math.ceil(ms)} ms`);
    } else if (detail.type === 'google.rpc.BadRequest') {
      for (const v of detail.field_violations || []) {
        console.log(`field violation: ${v.field}: ${v.description}`);
      }
    }
  }
  process.exitCode = 1;
});
