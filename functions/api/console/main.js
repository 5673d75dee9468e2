// The tenant console: plain ES modules, no framework, no build step. Served with a CSP that
// allows only this origin's scripts, so everything the page does is in this directory. This
// module wires the page's controls to the modules that act on them, then shows the view the
// URL names.

import { api, currentKey, onKeyRefused } from "./api.js";
import { $ } from "./dom.js";
import { loadFailed, onRedelivered, redeliverAll } from "./failed-fires.js";
import { confirmGroup, onGroupConfirmClosed } from "./groups.js";
import { createKey } from "./keys.js";
import { route } from "./router.js";
import { showTenant, signIn, signOut } from "./session.js";
import { page } from "./state.js";
import { createTimer, fillEdit, fillTimeZones, schedulePreview, showKind } from "./timer-form.js";
import {
  act,
  confirmDelete,
  moreFires,
  onConfirmClosed,
  refreshTimer,
  resetTimer,
  runNow,
  saveEdit,
} from "./timer-page.js";
import { loadTimers, renderTimers } from "./timers-list.js";
import { loadUsage } from "./usage.js";

function start() {
  onKeyRefused(() => signOut("The API no longer accepts this key: sign in again."));
  onRedelivered(refreshTimer);
  $("sign-in-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", () => signOut());
  $("status-filter").addEventListener("change", () => loadTimers(true));
  $("group-filter").addEventListener("change", () => loadTimers(true));
  $("group-pause").addEventListener("click", () => confirmGroup("pause"));
  $("group-resume").addEventListener("click", () => confirmGroup("resume"));
  $("group-delete").addEventListener("click", () => confirmGroup("delete"));
  $("group-dialog").addEventListener("close", onGroupConfirmClosed);
  $("name-search").addEventListener("input", renderTimers);
  $("refresh-timers").addEventListener("click", () => loadTimers(true));
  $("timers-more").addEventListener("click", () => loadTimers(false));
  $("kind").addEventListener("change", () => {
    showKind();
    schedulePreview();
  });
  const scheduleInputs = ["after-seconds", "at-time", "cron-expression", "cron-timezone", "every-seconds"];
  for (const id of [...scheduleInputs, "max-fires"]) $(id).addEventListener("input", schedulePreview);
  $("target-kind").addEventListener("change", () => ($("target-url-field").hidden = !$("target-kind").value));
  $("create-form").addEventListener("submit", createTimer);
  $("pause-button").addEventListener("click", () => act("pause"));
  $("resume-button").addEventListener("click", () => act("resume"));
  $("delete-button").addEventListener("click", confirmDelete);
  $("reset-button").addEventListener("click", resetTimer);
  $("run-button").addEventListener("click", runNow);
  $("edit-form").addEventListener("submit", saveEdit);
  $("edit-details").addEventListener("toggle", () => {
    if ($("edit-details").open && page.timer) fillEdit(page.timer);
  });
  $("key-form").addEventListener("submit", createKey);
  $("usage-form").addEventListener("submit", (event) => {
    event.preventDefault();
    loadUsage();
  });
  $("confirm-dialog").addEventListener("close", onConfirmClosed);
  $("redeliver-all-button").addEventListener("click", () => redeliverAll(page.id));
  $("fires-more").addEventListener("click", moreFires);
  $("failed-filter").addEventListener("submit", (event) => {
    event.preventDefault();
    loadFailed(true);
  });
  $("failed-more").addEventListener("click", () => loadFailed(false));
  window.addEventListener("hashchange", route);
  fillTimeZones();
  showKind();
  if (currentKey()) {
    api("GET", "tenant").then(showTenant, () => {}); // a refused key signs out (onKeyRefused)
  }
  route();
}

start();
