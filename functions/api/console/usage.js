// Usage in a month (UTC): the counts, and the fires enqueued by lateness.

import { api, query } from "./api.js";
import { $, clearError, el, showError, svg } from "./dom.js";

export async function loadUsage() {
  clearError($("usage-error"));
  const month = $("usage-month").value.trim();
  try {
    const used = await api("GET", `tenant/usage${query({ month })}`);
    const rows = [
      ["Month", used.month],
      ["Fires enqueued", used.fires.enqueued],
      ["Fires delivered (webhooks)", used.fires.delivered],
      ["Fires failed", used.fires.failed],
      ["Fires late by more than 1 s", used.fires.late_1s],
      ["Timers created", used.timers_created],
      ["Timers active", used.active_timers],
    ];
    $("usage-details").replaceChildren(
      ...rows.flatMap(([name, value]) => [
        el("dt", { text: name }),
        el("dd", { "data-field": name.toLowerCase().replace(/[^a-z0-9]+/g, "-"), text: String(value) }),
      ]),
    );
    showLagLevels(used.lag);
  } catch (error) {
    $("usage-details").replaceChildren();
    $("usage-lag").hidden = true;
    showError($("usage-error"), error);
  }
}

// The accuracy levels of the usage answer's "lag", earliest first, as the page names them.
const LAG_LEVELS = [
  ["ontime", "on time (0 ms)"],
  ["1-200ms", "1 - 200 ms"],
  ["200-600ms", "200 - 600 ms"],
  ["600-1000ms", "600 - 1,000 ms"],
  ["1000-2000ms", "1,000 - 2,000 ms"],
  ["over_2000ms", "over 2,000 ms"],
];

function showLagLevels(lag) {
  if (!lag) {
    $("usage-lag").hidden = true; // an API without the levels
    return;
  }
  const total = LAG_LEVELS.reduce((sum, [level]) => sum + (lag[level] || 0), 0);
  $("usage-lag-table").tBodies[0].replaceChildren(
    ...LAG_LEVELS.map(([level, label]) => {
      const count = lag[level] || 0;
      const share = total ? (100 * count) / total : 0;
      const text = total ? `${share.toFixed(1)}%` : "-";
      const bar = svg("svg", {
        class: "share-bar",
        viewBox: "0 0 100 8",
        preserveAspectRatio: "none",
        "aria-hidden": "true",
      });
      bar.append(
        svg("rect", { class: "share-track", width: 100, height: 8 }),
        svg("rect", { class: "share-fill", width: share.toFixed(2), height: 8 }),
      );
      return el(
        "tr",
        { "data-level": level },
        el("th", { scope: "row", text: label }),
        el("td", { "data-field": "fires", text: String(count) }),
        el("td", { "data-field": "share" }, el("span", { text }), bar),
      );
    }),
  );
  $("usage-lag").hidden = false;
}
