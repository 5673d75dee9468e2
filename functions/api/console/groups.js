// Groups: the tenant's group names as the filters' suggestions, and the filtered group's
// pause, resume and delete behind a confirmation.

import { api, query, segment } from "./api.js";
import { $, clearError, el, notice, showError } from "./dom.js";
import { loadTimers } from "./timers-list.js";

export async function loadGroups() {
  try {
    const names = [];
    let cursor = null;
    do {
      const page = await api("GET", `groups${query({ limit: 100, cursor })}`);
      names.push(...page.items.map((g) => g.name));
      cursor = page.next_cursor;
    } while (cursor && names.length < 1000);
    $("group-names").replaceChildren(...names.map((name) => el("option", { value: name })));
  } catch (error) {
    // only the suggestions are missing: the filter and the actions still work
  }
}

const GROUP_ACTIONS = {
  pause: { method: "POST", suffix: "/pause", done: "Paused", question: "Pause every timer of group" },
  resume: { method: "POST", suffix: "/resume", done: "Resumed", question: "Resume every timer of group" },
  delete: { method: "DELETE", suffix: "", done: "Deleted", question: "Delete every timer of group" },
};
const groupAction = { action: null, group: null };

export function confirmGroup(action) {
  const group = $("group-filter").value.trim();
  if (!group) return;
  groupAction.action = action;
  groupAction.group = group;
  const tail = action === "delete" ? " They will never fire again." : "";
  $("group-confirm-text").textContent = `${GROUP_ACTIONS[action].question} ${group}?${tail}`;
  $("group-ok").textContent = { pause: "Pause", resume: "Resume", delete: "Delete" }[action];
  const dialog = $("group-dialog");
  dialog.returnValue = "";
  dialog.showModal();
}

export async function onGroupConfirmClosed() {
  if ($("group-dialog").returnValue !== "ok" || !groupAction.action) return;
  const { action, group } = groupAction;
  const spec = GROUP_ACTIONS[action];
  clearError($("timers-error"));
  let changed = 0;
  try {
    // one call changes up to 500 timers: call again until the API says done
    for (;;) {
      const step = await api(spec.method, `groups/${segment(group)}${spec.suffix}`);
      changed += step.changed;
      $("group-progress").textContent = `${spec.done} ${changed} timers of ${group}${step.done ? "." : " so far…"}`;
      if (step.done) break;
    }
    notice(`${spec.done} ${changed} timers of group ${group}`);
    if (action === "delete") $("group-filter").value = "";
    await loadTimers(true);
    loadGroups();
  } catch (error) {
    showError($("timers-error"), error);
  }
}
