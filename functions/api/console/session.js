// Sign in and out: the key is checked against GET /v1/tenant before it is kept.

import { ApiError, api, forgetKey, keepKey } from "./api.js";
import { $, clearError, showError, showView } from "./dom.js";
import { route } from "./router.js";
import { failed } from "./state.js";
import { stopPolling } from "./timer-page.js";
import { forgetTimers } from "./timers-list.js";

const SIGNED_IN_ONLY = ["whoami", "sign-out", "nav-keys", "nav-usage"];

export async function signIn(event) {
  event.preventDefault();
  const key = $("api-key").value.trim();
  clearError($("sign-in-error"));
  try {
    const me = await api("GET", "tenant", undefined, key);
    keepKey(key);
    $("api-key").value = "";
    showTenant(me);
    route();
  } catch (error) {
    showError($("sign-in-error"), error);
  }
}

export function showTenant(me) {
  $("whoami").textContent = `Tenant ${me.tenant}`;
  for (const id of SIGNED_IN_ONLY) $(id).hidden = false;
}

export function signOut(reason) {
  forgetKey();
  stopPolling();
  forgetTimers();
  failed.available = null;
  for (const id of SIGNED_IN_ONLY) $(id).hidden = true;
  $("new-key").hidden = true;
  $("new-key-secret").textContent = "";
  showView("sign-in-view");
  if (reason) showError($("sign-in-error"), new ApiError(401, { error: { message: reason } }));
  else clearError($("sign-in-error"));
  $("api-key").focus();
}
