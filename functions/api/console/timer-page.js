// One timer's page: its details, refreshed every 2 s while open, and its actions: pause,
// resume, edit, reset, run now, delete behind a confirmation.

import { api, query, segment } from "./api.js";
import { $, clearError, el, notice, showError, showView } from "./dom.js";
import { renderFires } from "./fire-history.js";
import { describeSchedule, describeTarget, nextFireText } from "./format.js";
import { list, page } from "./state.js";
import { fillEdit, readEdit } from "./timer-form.js";

const POLL_MS = 2000; // the timer page refreshes its fires while it is open

export function stopPolling() {
  clearInterval(page.poll);
  page.poll = null;
}

export async function openTimer(id) {
  Object.assign(page, { id, timer: null, fires: [], cursor: null, pagedBeyondFirst: false });
  $("timer-id").textContent = id;
  $("timer-details").replaceChildren();
  $("fires-table").tBodies[0].replaceChildren();
  $("lag-chart").replaceChildren();
  $("edit-details").open = false;
  delete $("edit-form").dataset.timer;
  clearError($("timer-error"));
  showView("timer-view");
  await refreshTimer();
  if (page.id === id && !page.poll) page.poll = setInterval(refreshTimer, POLL_MS); // still here
}

export function refreshTimer() {
  // kept, so a delete can wait for a read in flight (it would meet a 404 after the delete)
  page.refreshing = fetchTimer();
  return page.refreshing;
}

async function fetchTimer() {
  const id = page.id;
  if (!id) return;
  try {
    const timer = await api("GET", `timers/${segment(id)}`);
    if (id !== page.id) return;
    page.timer = timer;
    renderTimer();
    if (!page.pagedBeyondFirst) {
      const fires = await api("GET", `timers/${segment(id)}/fires?limit=50`);
      if (id !== page.id) return;
      page.fires = fires.items;
      page.cursor = fires.next_cursor;
      renderFires();
    }
  } catch (error) {
    if (id !== page.id) return;
    if (error.status === 404) stopPolling(); // deleted or never ours: nothing more to fetch
    showError($("timer-error"), error);
  }
}

export async function moreFires() {
  try {
    const next = query({ limit: 50, cursor: page.cursor });
    const fires = await api("GET", `timers/${segment(page.id)}/fires${next}`);
    page.fires.push(...fires.items);
    page.cursor = fires.next_cursor;
    page.pagedBeyondFirst = true; // polling would drop the pages loaded by hand
    renderFires();
  } catch (error) {
    showError($("timer-error"), error);
  }
}

function renderTimer() {
  const t = page.timer;
  const rows = [
    ["Name", t.name || "—"],
    ["Status", t.status],
    ["Schedule", describeSchedule(t.schedule)],
    ["Next fire", nextFireText(t)],
    ["Fires so far", String(t.fire_count)],
    ["Max fires", t.max_fires === null ? "—" : String(t.max_fires)],
    ["Group", t.group || "—"],
    ["Window", t.window_seconds ? `${t.window_seconds} s after each due time at most` : "none: on the dot"],
    ["Start at", t.start_at || "—"],
    ["End at", t.end_at || "—"],
    ["Misfire", t.misfire],
    ["Target", describeTarget(t.target)],
    ["Payload", JSON.stringify(t.payload, null, 2)],
    ["Created", t.created_at],
    ["Updated", t.updated_at],
    ["Expires", t.expires_at || "—"],
  ];
  $("timer-details").replaceChildren(
    ...rows.flatMap(([name, value]) => [
      el("dt", { text: name }),
      el(
        "dd",
        { "data-field": name.toLowerCase().replace(/ /g, "-") },
        name === "Payload" ? el("pre", { text: value }) : value,
      ),
    ]),
  );
  $("pause-button").hidden = t.status !== "active";
  $("resume-button").hidden = t.status !== "paused";
  // never under the user's typing, but filled once the timer is first read
  if (!$("edit-details").open || $("edit-form").dataset.timer !== t.id) fillEdit(t);
}

// ------------------------------------------------------------------ pause, resume, edit, reset, run now

export async function act(action) {
  clearError($("timer-error"));
  try {
    page.timer = await api("POST", `timers/${segment(page.id)}/${action}`);
    list.loaded = false;
    renderTimer();
    notice(`${action === "pause" ? "Paused" : "Resumed"} ${page.id}`);
  } catch (error) {
    showError($("timer-error"), error);
  }
}

export async function saveEdit(event) {
  event.preventDefault();
  clearError($("edit-error"));
  try {
    const changes = readEdit(page.timer);
    if (!Object.keys(changes).length) {
      notice("Nothing changed");
      return;
    }
    page.timer = await api("PATCH", `timers/${segment(page.id)}`, changes);
    list.loaded = false;
    $("edit-details").open = false;
    renderTimer();
    notice(`Saved ${page.id}`);
  } catch (error) {
    showError($("edit-error"), error);
  }
}

export async function resetTimer() {
  clearError($("timer-error"));
  try {
    page.timer = await api("POST", `timers/${segment(page.id)}/reset`);
    list.loaded = false;
    renderTimer();
    notice(`Reset ${page.id}: next fire ${page.timer.next_fire_at || "none"}`);
  } catch (error) {
    showError($("timer-error"), error);
  }
}

export async function runNow() {
  clearError($("timer-error"));
  try {
    const fire = await api("POST", `timers/${segment(page.id)}/run`);
    notice(`Fired ${fire.fire_id}`);
    refreshTimer();
  } catch (error) {
    showError($("timer-error"), error);
  }
}

// ------------------------------------------------------------------ delete

export function confirmDelete() {
  const dialog = $("confirm-dialog");
  const name = page.timer && page.timer.name ? ` (${page.timer.name})` : "";
  $("confirm-text").textContent = `Delete timer ${page.id}${name}? It will never fire again.`;
  dialog.returnValue = "";
  dialog.showModal();
}

export async function onConfirmClosed() {
  if ($("confirm-dialog").returnValue !== "ok") return;
  const id = page.id;
  stopPolling(); // and the read in flight ends first: none meets the deleted timer
  await page.refreshing;
  try {
    await api("DELETE", `timers/${segment(id)}`);
    list.timers = list.timers.filter((t) => t.id !== id);
    notice(`Deleted ${id}`);
    location.hash = "#/";
  } catch (error) {
    showError($("timer-error"), error);
    if (page.id === id && !page.poll) page.poll = setInterval(refreshTimer, POLL_MS);
  }
}
