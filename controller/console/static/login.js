// The sign-in page of a console that listens beyond loopback: exchange the credential for a
// session cookie, then go to the console. The credential is sent once and not kept.
"use strict";
document.getElementById("sign-in").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = document.getElementById("token");
  const result = document.getElementById("result");
  const token = input.value;
  input.value = "";
  try {
    const response = await fetch("/api/session", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ token }),
      credentials: "same-origin",
    });
    if (response.ok) {
      window.location.assign("/");
      return;
    }
    const body = await response.json();
    result.textContent = `Refused: ${body.error.reason || body.error.code} — ${body.error.message}`;
  } catch (err) {
    result.textContent = `Cannot reach the controller: ${err}`;
  }
});
