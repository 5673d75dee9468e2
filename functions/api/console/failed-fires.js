// The failed fires panel: failed fires by timer over a time window, and their redelivery (one
// fire or all of a timer's, from this panel or the timer's page). The routes may not exist on
// an older deployment: a 404 hides the panel and the buttons.

import { api, query, segment } from "./api.js";
import { $, clearError, el, hiddenText, labelCells, notice, scrollBox, showError, smallButton } from "./dom.js";
import { orDash, timeCell } from "./format.js";
import { failed, newestOnly, page } from "./state.js";

const FAILED_COLUMNS = ["Fire", "Due", "Failed", "Reason", "Last status", "Attempts", ""];

function failedQuery(cursor) {
  if (!$("failed-since").value) {
    $("failed-since").value = new Date(Date.now() - 7 * 86400_000).toISOString().replace(/\.\d+Z$/, "Z");
  }
  return query({
    status: "failed",
    since: $("failed-since").value.trim(),
    until: $("failed-until").value.trim(),
    limit: 50,
    cursor,
  });
}

const failedLoad = newestOnly();

export async function loadFailed(reset) {
  if (failed.available === false) return;
  const isNewest = failedLoad();
  if (reset) {
    failed.items = [];
    failed.cursor = null;
  }
  clearError($("failed-error"));
  try {
    const answer = await api("GET", `fires${failedQuery(failed.cursor)}`);
    if (!isNewest()) return;
    failed.available = true;
    failed.items.push(...answer.items);
    failed.cursor = answer.next_cursor;
  } catch (error) {
    if (!isNewest()) return;
    if (error.status === 404 && failed.available === null) {
      failed.available = false;
      $("failed-panel").hidden = true;
      document.body.dataset.failedFires = "absent"; // settled: for people and tests alike
      return;
    }
    showError($("failed-error"), error);
  }
  $("failed-panel").hidden = false;
  document.body.dataset.failedFires = "available";
  renderFailed();
}

function renderFailed() {
  const groups = new Map();
  for (const fire of failed.items) {
    if (!groups.has(fire.timer_id)) groups.set(fire.timer_id, []);
    groups.get(fire.timer_id).push(fire);
  }
  const blocks = [...groups].map(([timerId, fires]) => {
    const rows = fires.map((f) =>
      el(
        "tr",
        { "data-fire": f.fire_id },
        el("td", {}, el("code", { text: f.fire_id })),
        timeCell(f.due_at),
        timeCell(f.failed_at),
        el("td", { text: f.reason || "" }),
        el("td", { text: orDash(f.last_status) }),
        el("td", { text: orDash(f.attempts) }),
        el("td", {}, redeliverButton(f.timer_id, f.fire_id)),
      ),
    );
    const head = el("tr", {}, ...FAILED_COLUMNS.map((h) => el("th", {}, h || hiddenText("Action"))));
    const table = el("table", { className: "reflow" }, el("thead", {}, head), el("tbody", {}, ...rows));
    labelCells(table);
    return el(
      "div",
      { className: "failed-group", "data-timer": timerId },
      el(
        "div",
        { className: "row" },
        el("a", { href: `#/timers/${segment(timerId)}`, text: timerId }),
        el("span", { text: fires[0].name || "" }),
        smallButton("Redeliver all", () => redeliverAll(timerId), `Redeliver all failed fires of ${timerId}`),
      ),
      scrollBox(table, `Failed fires of ${timerId}`),
    );
  });
  const none = el("p", { className: "hint", text: "No failed fire in this window." });
  $("failed-groups").replaceChildren(...(blocks.length ? blocks : [none]));
  $("failed-more").hidden = !failed.cursor;
}

// ------------------------------------------------------------------ redelivery

export function redeliverButton(timerId, fireId) {
  return smallButton("Redeliver", () => redeliver(timerId, fireId), `Redeliver fire ${fireId}`);
}

async function redeliver(timerId, fireId) {
  try {
    await api("POST", `timers/${segment(timerId)}/fires/${segment(fireId)}/redeliver`);
    notice(`Redelivering ${fireId}`);
    afterRedelivery();
  } catch (error) {
    showError(page.id ? $("timer-error") : $("failed-error"), error);
  }
}

export async function redeliverAll(timerId) {
  try {
    const answer = await api("POST", `timers/${segment(timerId)}/fires:redeliver`);
    notice(`Redelivering ${answer.items.length} fires of ${timerId}`);
    afterRedelivery();
  } catch (error) {
    showError(page.id ? $("timer-error") : $("failed-error"), error);
  }
}

let refreshOpenTimer = () => {};
// How the open timer's page refreshes after a redelivery: set by main.js, since that page
// imports this module (for its Redeliver buttons).
export function onRedelivered(refresh) {
  refreshOpenTimer = refresh;
}

function afterRedelivery() {
  if (!$("timer-view").hidden) refreshOpenTimer();
  loadFailed(true); // a redelivered fire is a failure no more: the API leaves it out of the list
}
