// The open timer's fire history: the table (a failed webhook fire with its last attempt and a
// Redeliver button) and the lag chart (inline SVG, oldest fire on the left).

import { $, el, svg } from "./dom.js";
import { redeliverButton } from "./failed-fires.js";
import { timeCell } from "./format.js";
import { failed, page } from "./state.js";

const CHART_FIRES = 100;

// The last POST of an HTTP fire, in words: "http 503 after 120 ms: <the answer's start>".
function lastErrorText(last) {
  if (!last) return null;
  const what = last.status !== null ? `http ${last.status}` : last.error || "no answer";
  const body = last.body ? `: ${last.body}` : "";
  return `last attempt ${what} after ${last.latency_ms} ms${body}`;
}

function lagOf(fire) {
  if (typeof fire.lag_ms === "number") return fire.lag_ms;
  if (fire.enqueued_at) return Date.parse(fire.enqueued_at) - Date.parse(fire.scheduled_at);
  return null;
}

export function renderFires() {
  const failedHere = page.fires.some((f) => f.status === "failed");
  $("redeliver-all-button").hidden = !(failedHere && failed.available);
  $("fires-table").tBodies[0].replaceChildren(
    ...page.fires.map((f) => {
      const lag = lagOf(f);
      const reason = [
        f.reason,
        f.last_status && !f.last_error ? `last status ${f.last_status}` : null,
        f.attempts ? `${f.attempts} attempts` : null,
      ]
        .filter(Boolean)
        .join("; ");
      const lastError = f.status === "delivered" ? null : lastErrorText(f.last_error);
      const action = f.status === "failed" && failed.available ? redeliverButton(page.id, f.fire_id) : null;
      return el(
        "tr",
        { "data-fire": f.fire_id },
        el("td", {}, el("code", { text: f.fire_id })),
        timeCell(f.scheduled_at),
        timeCell(f.enqueued_at),
        timeCell(f.delivered_at), // webhooks: when a POST got a 2xx
        el("td", { className: "lag", text: lag === null ? "—" : String(lag) }),
        el("td", {}, el("span", { className: `status ${f.status}`, text: f.status })),
        el(
          "td",
          {},
          reason,
          lastError ? el("div", { className: "last-error", "data-last-error": "", text: lastError }) : null,
        ),
        el("td", {}, action),
      );
    }),
  );
  $("fires-more").hidden = !page.cursor;
  drawLagChart();
}

function drawLagChart() {
  const points = page.fires
    .map((f) => ({ fire: f, lag: lagOf(f) }))
    .filter((p) => p.lag !== null)
    .sort((a, b) => Date.parse(a.fire.scheduled_at) - Date.parse(b.fire.scheduled_at))
    .slice(-CHART_FIRES);
  const box = $("lag-chart");
  if (!points.length) {
    box.replaceChildren(el("p", { className: "hint", text: "No enqueued fire yet." }));
    return;
  }
  const [width, height, left, bottom, top] = [720, 180, 56, 20, 12];
  const lags = points.map((p) => p.lag);
  const sorted = [...lags].sort((a, b) => a - b);
  const max = Math.max(1, sorted[sorted.length - 1]);
  const median = sorted[Math.floor((sorted.length - 1) / 2)];
  const plotH = height - bottom - top;
  const slot = (width - left) / Math.max(points.length, 10);
  const chart = svg("svg", {
    viewBox: `0 0 ${width} ${height}`,
    role: "img",
    class: "chart",
    "aria-label": "Lag per fire",
  });
  chart.append(
    svg("line", { x1: left, y1: top, x2: left, y2: top + plotH, class: "axis" }),
    svg("line", { x1: left, y1: top + plotH, x2: width, y2: top + plotH, class: "axis" }),
    svg("text", { x: left - 6, y: top + 4, class: "label end" }, `${max} ms`),
    svg("text", { x: left - 6, y: top + plotH, class: "label end" }, "0"),
  );
  points.forEach((p, i) => {
    const h = Math.max(1, (Math.max(0, p.lag) / max) * plotH);
    const bar = svg("rect", {
      x: left + i * slot + slot * 0.15,
      y: top + plotH - h,
      width: slot * 0.7,
      height: h,
      class: `bar ${p.fire.status}`,
    });
    bar.append(svg("title", {}, `${p.fire.fire_id}: ${p.lag} ms (due ${p.fire.scheduled_at})`));
    chart.append(bar);
  });
  const summary = `${points.length} fires; median ${median} ms; max ${sorted[sorted.length - 1]} ms`;
  const caption = el("p", { className: "hint", id: "lag-summary", text: summary });
  box.replaceChildren(chart, caption);
}
