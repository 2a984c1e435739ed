"""The ONNX decode engine and its generated model: deterministic, batched without changing any
row's output, exact budgets, the model contract checked at load with one line, cancellation."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx_support import require_onnx

require_onnx()

from onnx import ModelProto, TensorProto, helper  # noqa: E402

from worker.onnx_engine import (  # noqa: E402
    PREFILL_CHUNK,
    PREFILL_TOKENS,
    DecoderEngine,
    GenerationCancelled,
    ModelContractError,
)
from worker.onnx_model import (  # noqa: E402
    build_model,
    default_model_path,
    ensure_model,
    generate_model,
    generate_preset,
)

PROMPTS = [
    b"hello world",
    b"",
    b"a",
    "h\u00e9llo \u2713 unicode".encode(),
    bytes(range(256)),  # every byte value, longer than a prefill chunk
    b"The quick brown fox jumps over the lazy dog. " * 7,
]
BUDGETS = [20, 13, 1, 33, 7, 40]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> DecoderEngine:
    path = generate_preset(tmp_path_factory.mktemp("models") / "small.onnx", "small")
    return DecoderEngine(str(path))


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> DecoderEngine:
    path = generate_preset(tmp_path_factory.mktemp("models") / "large.onnx", "large")
    return DecoderEngine(str(path))


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1-layer model with a 64-position context (truncation and clamping are reachable)."""
    return generate_model(
        tmp_path_factory.mktemp("models") / "tiny.onnx",
        layers=1,
        d_model=32,
        heads=2,
        max_context=64,
    )


def test_the_same_seed_writes_a_byte_identical_file(tmp_path: Path) -> None:
    a = generate_model(tmp_path / "a.onnx", layers=2, d_model=64, heads=4, seed=3)
    b = generate_model(tmp_path / "b.onnx", layers=2, d_model=64, heads=4, seed=3)
    c = generate_model(tmp_path / "c.onnx", layers=2, d_model=64, heads=4, seed=4)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temp file behind


def test_the_presets_are_small_files(tmp_path: Path) -> None:
    small = generate_preset(tmp_path / "s.onnx", "small")
    large = generate_preset(tmp_path / "l.onnx", "large")
    assert small.stat().st_size < 2_000_000
    assert large.stat().st_size < 8_000_000
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        generate_preset(tmp_path / "h.onnx", "huge")


def test_ensure_model_generates_once_into_the_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HALCYON_CACHE_DIR", str(tmp_path / "cache"))
    path = default_model_path("small", 5)
    assert path == tmp_path / "cache" / "models" / "small-5.onnx"
    assert not path.exists()
    assert ensure_model("small", 5) == path
    first = path.stat().st_mtime_ns
    assert ensure_model("small", 5) == path
    assert path.stat().st_mtime_ns == first  # reused, not rewritten
    assert DecoderEngine(str(path)).layers == 2


def test_the_engine_reads_the_contract(small: DecoderEngine, large: DecoderEngine) -> None:
    assert (small.layers, small.heads, small.head_dim, small.max_context) == (2, 4, 32, 1024)
    assert (large.layers, large.heads, large.head_dim, large.max_context) == (4, 4, 64, 1024)
    assert small.bos_token_id == 256
    assert "no EOS" in small.contract and "\n" not in small.contract


def test_each_item_gets_exactly_its_budget(small: DecoderEngine) -> None:
    out = small.generate([b"x", b"yy", b"", b"zzz"], [0, 1, 5, 37])
    assert [len(o) for o in out] == [0, 1, 5, 37]
    assert small.generate([], []) == []
    assert small.generate([b"a", b"b"], [0, 0]) == [b"", b""]
    with pytest.raises(ValueError):
        small.generate([b"a"], [1, 2])
    with pytest.raises(ValueError):
        small.generate([b"a"], [-1])


def test_generation_is_deterministic(small: DecoderEngine) -> None:
    first = small.generate(PROMPTS, BUDGETS)
    assert small.generate(PROMPTS, BUDGETS) == first
    # The prompt matters (attention really reads it): different prompts, different bytes.
    assert len({small.generate([p], [24])[0] for p in PROMPTS}) >= 4


@pytest.mark.parametrize("preset", ["small", "large"])
def test_a_batch_gives_each_row_what_it_gets_alone(
    preset: str, small: DecoderEngine, large: DecoderEngine
) -> None:
    # Left padding (masked) and position ids per row must not change any row's output, nor
    # evicting finished rows from the batch, nor chunking a long prompt's prefill.
    engine = small if preset == "small" else large
    assert max(len(p) for p in PROMPTS) > PREFILL_CHUNK
    batched = engine.generate(PROMPTS, BUDGETS)
    alone = [engine.generate([p], [n])[0] for p, n in zip(PROMPTS, BUDGETS, strict=True)]
    assert batched == alone
    # The same prompt twice in one batch, with different budgets: one a prefix of the other.
    twice = engine.generate([b"repeat me", b"repeat me"], [30, 12])
    assert twice[0][:12] == twice[1]


def test_a_wide_batch_prefills_in_smaller_chunks_with_the_same_outputs(
    small: DecoderEngine,
) -> None:
    prompts = [bytes([65 + i]) * (150 + 7 * i) for i in range(16)]
    assert PREFILL_TOKENS // len(prompts) < max(len(p) for p in prompts) // 2  # several chunks
    budgets = [3 + i for i in range(16)]
    batched = small.generate(prompts, budgets)
    assert batched == [small.generate([p], [n])[0] for p, n in zip(prompts, budgets, strict=True)]
    polls = 0

    def stop_in_the_prefill() -> bool:
        nonlocal polls
        polls += 1
        return polls >= 2  # the first check passes; the next, between two chunks, stops

    with pytest.raises(GenerationCancelled, match="prefill"):
        small.generate(prompts, budgets, should_stop=stop_in_the_prefill)


def test_a_long_prompt_is_truncated_from_the_left(tiny_path: Path) -> None:
    engine = DecoderEngine(str(tiny_path))
    assert engine.max_context == 64
    prompt = bytes(range(32, 132))  # 100 bytes; 10 new bytes leave room for 54 of them
    (out,) = engine.generate([prompt], [10])
    assert engine.generate([prompt[-54:]], [10]) == [out]
    # A budget past the context is clamped to max_context - 1 bytes.
    assert engine.clamp_new_tokens(1000) == 63
    (long,) = engine.generate([b"abc"], [1000])
    assert len(long) == 63


def test_should_stop_is_polled_before_the_prefill_and_between_steps(small: DecoderEngine) -> None:
    with pytest.raises(GenerationCancelled):
        small.generate([b"a"], [5], should_stop=lambda: True)
    polls = 0

    def stop_at_the_fourth_poll() -> bool:
        nonlocal polls
        polls += 1
        return polls >= 4

    with pytest.raises(GenerationCancelled):
        small.generate([b"a", b"b"], [50, 50], should_stop=stop_at_the_fourth_poll)
    assert polls == 4
    counted = 0

    def count() -> bool:
        nonlocal counted
        counted += 1
        return False

    small.generate([b"a"], [10], should_stop=count)
    assert counted == 10  # before the prefill, then before each of the 9 decode steps


# -- the contract, checked at load --------------------------------------------------------


def _tiny_model() -> ModelProto:
    return build_model(layers=1, d_model=32, heads=2, max_context=32)


def _save(model: ModelProto, path: Path) -> str:
    path.write_bytes(model.SerializeToString())
    return str(path)


def _rename_input(model: ModelProto, old: str, new: str) -> None:
    for value in model.graph.input:
        if value.name == old:
            value.name = new
    for node in model.graph.node:
        node.input[:] = [new if name == old else name for name in node.input]


def _load_error(path: str) -> str:
    with pytest.raises(ModelContractError) as info:
        DecoderEngine(path)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_the_generated_model_fits_the_contract(tmp_path: Path) -> None:
    engine = DecoderEngine(_save(_tiny_model(), tmp_path / "ok.onnx"))
    assert engine.layers == 1 and engine.max_context == 32


def test_a_wrong_input_name_is_named(tmp_path: Path) -> None:
    model = _tiny_model()
    _rename_input(model, "input_ids", "tokens")
    message = _load_error(_save(model, tmp_path / "renamed.onnx"))
    assert message == "renamed.onnx: input 'input_ids' is missing (want int64 [batch, sequence])"


def test_a_wrong_input_dtype_is_named(tmp_path: Path) -> None:
    model = _tiny_model()
    for value in model.graph.input:
        if value.name == "input_ids":
            value.type.tensor_type.elem_type = TensorProto.INT32  # Gather takes int32 too
    message = _load_error(_save(model, tmp_path / "int32.onnx"))
    assert message == (
        "int32.onnx: input 'input_ids' must be int64 [batch, sequence], "
        "found int32 [batch, sequence]"
    )


def test_a_wrong_rank_is_named(tmp_path: Path) -> None:
    model = _tiny_model()
    for value in model.graph.input:
        if value.name == "attention_mask":
            value.type.tensor_type.shape.dim.add().dim_param = "extra"
    message = _load_error(_save(model, tmp_path / "rank.onnx"))
    assert "input 'attention_mask' must be int64 [batch, total_sequence], found int64 [" in message


def test_a_missing_output_is_named(tmp_path: Path) -> None:
    model = _tiny_model()
    kept = [v for v in model.graph.output if v.name != "present.0.value"]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    message = _load_error(_save(model, tmp_path / "no-present.onnx"))
    assert message.startswith("no-present.onnx: output 'present.0.value' is missing")


def test_a_model_without_a_kv_cache_is_refused(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["logits"], to=TensorProto.FLOAT)],
        "no_cache",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    message = _load_error(_save(model, tmp_path / "plain.onnx"))
    assert "input 'past_key_values.0.key' is missing" in message


def test_a_missing_max_context_is_named(tmp_path: Path) -> None:
    model = _tiny_model()
    kept = [p for p in model.metadata_props if p.key != "halcyon.max_context"]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    message = _load_error(_save(model, tmp_path / "no-meta.onnx"))
    assert "metadata 'halcyon.max_context' is missing" in message


def test_a_file_that_is_not_onnx_is_one_line(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a model\n\x00\x01\x02" * 10)
    message = _load_error(str(junk))
    assert message.startswith(f"{junk}: not a loadable ONNX model: ")
    message = _load_error(str(tmp_path / "missing.onnx"))
    assert message == f"{tmp_path / 'missing.onnx'}: no such model file"
