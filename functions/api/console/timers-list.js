// The timers list: filtered by status and group on the server, searched by name or id in the
// pages loaded so far.

import { api, query, segment } from "./api.js";
import { $, clearError, el, labelCells, showError } from "./dom.js";
import { describeSchedule, nextFireCell } from "./format.js";
import { list, newestOnly } from "./state.js";

const listLoad = newestOnly();

export async function loadTimers(reset) {
  const isNewest = listLoad();
  if (reset) {
    list.timers = [];
    list.cursor = null;
  }
  clearError($("timers-error"));
  const group = $("group-filter").value.trim();
  const params = { status: $("status-filter").value, group, limit: 50, cursor: list.cursor };
  showGroupActions(group);
  try {
    const page = await api("GET", `timers${query(params)}`);
    if (!isNewest()) return;
    list.timers.push(...page.items);
    list.cursor = page.next_cursor;
    list.loaded = true;
  } catch (error) {
    if (!isNewest()) return;
    showError($("timers-error"), error);
  }
  renderTimers();
}

// Sign-out: the list is forgotten, and a page still on its way is dropped when it lands.
export function forgetTimers() {
  listLoad();
  list.timers = [];
  list.cursor = null;
  list.loaded = false;
}

export function renderTimers() {
  const needle = $("name-search").value.trim().toLowerCase();
  const shown = list.timers.filter(
    (t) => !needle || (t.name || "").toLowerCase().includes(needle) || t.id.toLowerCase().includes(needle),
  );
  $("timers-table").tBodies[0].replaceChildren(
    ...shown.map((t) =>
      el(
        "tr",
        { "data-id": t.id },
        el("td", {}, el("a", { href: `#/timers/${segment(t.id)}`, text: t.id })),
        el("td", { text: t.name || "" }),
        el("td", {}, t.group ? groupLink(t.group) : ""),
        el("td", { text: describeSchedule(t.schedule) }),
        el("td", {}, el("span", { className: `status ${t.status}`, text: t.status })),
        nextFireCell(t),
      ),
    ),
  );
  labelCells($("timers-table"));
  const more = list.cursor ? "; more pages on the server" : "";
  const scope = needle ? ` (the name search covers the ${list.timers.length} loaded)` : "";
  $("timers-summary").textContent = `${shown.length} shown of ${list.timers.length} loaded${more}${scope}`;
  $("timers-more").hidden = !list.cursor;
}

function groupLink(name) {
  // a click filters the list to the group (and offers its actions)
  const link = el("a", { href: "#/", text: name });
  link.addEventListener("click", (event) => {
    event.preventDefault();
    $("group-filter").value = name;
    loadTimers(true);
  });
  return link;
}

// A group filter offers the group's actions (groups.js).
function showGroupActions(group) {
  $("group-actions").hidden = !group;
  $("group-actions-label").textContent = group ? `Group ${group}:` : "";
}
