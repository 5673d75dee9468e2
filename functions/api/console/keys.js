// The tenant's own API keys: list, create (the secret shown once, never stored), revoke.

import { api, segment } from "./api.js";
import { $, clearError, el, labelCells, notice, showError, smallButton } from "./dom.js";
import { timeCell } from "./format.js";

export async function loadKeys() {
  clearError($("keys-error"));
  try {
    const answer = await api("GET", "tenant/keys");
    renderKeys(answer.items);
  } catch (error) {
    showError($("keys-error"), error);
  }
}

function renderKeys(keys) {
  $("keys-table").tBodies[0].replaceChildren(
    ...keys.map((k) =>
      el(
        "tr",
        { "data-key": k.key_id },
        el("td", {}, el("code", { text: k.key_id })),
        el("td", { text: k.label || "" }),
        timeCell(k.created_at),
        timeCell(k.last_used_at),
        el("td", {}, smallButton("Revoke", () => revokeKey(k.key_id), `Revoke key ${k.key_id}`)),
      ),
    ),
  );
  labelCells($("keys-table"));
}

export async function createKey(event) {
  event.preventDefault();
  clearError($("keys-error"));
  const label = $("key-label").value.trim();
  try {
    const made = await api("POST", "tenant/keys", label ? { label } : {});
    $("new-key-secret").textContent = made.api_key; // shown this once: never stored here
    $("new-key").hidden = false;
    $("key-label").value = "";
    loadKeys();
  } catch (error) {
    showError($("keys-error"), error);
  }
}

async function revokeKey(keyId) {
  clearError($("keys-error"));
  try {
    await api("DELETE", `tenant/keys/${segment(keyId)}`);
    notice(`Revoked ${keyId}`);
    loadKeys();
  } catch (error) {
    showError($("keys-error"), error);
  }
}
