// The timer forms: create (with a live preview of the next fire times) and a timer's edit
// form (filled from the timer; read as the PATCH of what changed).

import { api, localError, segment } from "./api.js";
import { $, clearError, el, notice, showError } from "./dom.js";
import { relative, wallClock, zoneOf } from "./format.js";
import { list } from "./state.js";

const PREVIEW_DELAY_MS = 350; // debounce: preview once the user pauses typing
const PREVIEW_COUNT = 5;

function numberOrText(input) {
  // A number when it reads as one; otherwise the text as typed, for the API to name the field.
  const raw = input.value.trim();
  if (raw === "") return null;
  const value = Number(raw);
  return Number.isFinite(value) ? value : raw;
}

// ------------------------------------------------------------------ create, with a live preview

function readSchedule() {
  const kind = $("kind").value;
  switch (kind) {
    case "at":
      return { type: "at", at: $("at-time").value.trim() };
    case "after":
      return { type: "after", seconds: numberOrText($("after-seconds")) };
    case "cron":
      return {
        type: "cron",
        expression: $("cron-expression").value.trim(),
        timezone: $("cron-timezone").value.trim() || "UTC",
      };
    default:
      return { type: "every", seconds: numberOrText($("every-seconds")) };
  }
}

function readTimer() {
  const timer = { schedule: readSchedule() };
  const name = $("timer-name").value.trim();
  if (name) timer.name = name;
  const maxFires = numberOrText($("max-fires"));
  if (maxFires !== null) timer.max_fires = maxFires;
  const windowSeconds = numberOrText($("window-seconds"));
  if (windowSeconds) timer.window_seconds = windowSeconds;
  const group = $("timer-group").value.trim();
  if (group) timer.group = group;
  const targetKind = $("target-kind").value;
  if (targetKind) timer.target = { [targetKind]: $("target-url").value.trim() };
  const payload = $("payload").value.trim();
  if (payload) {
    try {
      timer.payload = JSON.parse(payload);
    } catch (exc) {
      throw localError("the payload is not valid JSON", "payload", exc.message);
    }
  }
  return timer;
}

export function showKind() {
  const kind = $("kind").value;
  for (const label of document.querySelectorAll("[data-kind]")) label.hidden = label.dataset.kind !== kind;
  if (kind === "at" && !$("at-time").value) {
    $("at-time").value = new Date(Date.now() + 60_000).toISOString().replace(/\.\d+Z$/, "Z");
  }
}

export function fillTimeZones() {
  const zones = typeof Intl.supportedValuesOf === "function" ? Intl.supportedValuesOf("timeZone") : [];
  $("time-zones").replaceChildren(...["UTC", ...zones].map((zone) => el("option", { value: zone })));
}

let previewTimer = null;
let previewSeq = 0;
export function schedulePreview() {
  clearTimeout(previewTimer);
  previewTimer = setTimeout(preview, PREVIEW_DELAY_MS);
}

async function preview() {
  const seq = ++previewSeq;
  const body = { schedule: readSchedule(), count: PREVIEW_COUNT };
  const maxFires = numberOrText($("max-fires"));
  if (maxFires !== null) body.max_fires = maxFires;
  try {
    const answer = await api("POST", "schedule-preview", body);
    if (seq !== previewSeq) return; // a newer preview is on its way
    clearError($("preview-error"));
    const zone = zoneOf(body.schedule);
    const times = answer.fire_times.map((iso) =>
      el(
        "li",
        { title: new Date(iso).toLocaleString() },
        el("time", { datetime: iso, text: iso }),
        " ",
        el(
          "span",
          { className: "when" },
          ...(zone ? [el("span", { className: "zone", text: wallClock(iso, zone) }), " "] : []),
          `(${relative(iso)})`,
        ),
      ),
    );
    $("preview-times").replaceChildren(...(times.length ? times : [el("li", { text: "never fires" })]));
  } catch (error) {
    if (seq !== previewSeq) return;
    $("preview-times").replaceChildren();
    showError($("preview-error"), error);
  }
}

export async function createTimer(event) {
  event.preventDefault();
  clearError($("create-error"));
  $("create-button").disabled = true;
  try {
    const created = await api("POST", "timers", readTimer());
    list.loaded = false; // the list shows it next time
    notice(`Created ${created.id}`);
    location.hash = `#/timers/${segment(created.id)}`;
  } catch (error) {
    showError($("create-error"), error);
  } finally {
    $("create-button").disabled = false;
  }
}

// ------------------------------------------------------------------ edit

export function fillEdit(t) {
  $("edit-form").dataset.timer = t.id;
  $("edit-name").value = t.name || "";
  $("edit-max-fires").value = t.max_fires === null ? "" : String(t.max_fires);
  $("edit-window").value = String(t.window_seconds || 0);
  // a retry policy is for HTTP targets (a queue send is retried by the service itself)
  for (const field of document.querySelectorAll("[data-http-only]")) field.hidden = !t.target.url;
  $("edit-retry-attempts").value = t.retry && t.retry.max_attempts ? String(t.retry.max_attempts) : "";
  $("edit-retry-age").value = t.retry && t.retry.max_age_seconds ? String(t.retry.max_age_seconds) : "";
  $("edit-payload").value = JSON.stringify(t.payload, null, 2);
}

// Only what the form changed goes in the PATCH; an emptied optional field is cleared (null).
export function readEdit(t) {
  const changes = {};
  const name = $("edit-name").value.trim() || null;
  if (name !== t.name) changes.name = name;
  const maxFires = numberOrText($("edit-max-fires"));
  if (maxFires !== t.max_fires) changes.max_fires = maxFires;
  const windowSeconds = numberOrText($("edit-window")) ?? 0;
  if (windowSeconds !== (t.window_seconds || 0)) changes.window_seconds = windowSeconds;
  if (!t.target.url) return withPayload(changes, t);
  const attempts = numberOrText($("edit-retry-attempts"));
  const age = numberOrText($("edit-retry-age"));
  const retry = attempts === null && age === null ? null : { max_attempts: attempts, max_age_seconds: age };
  if (JSON.stringify(retry) !== JSON.stringify(t.retry)) changes.retry = retry;
  return withPayload(changes, t);
}

function withPayload(changes, t) {
  let payload;
  try {
    payload = JSON.parse($("edit-payload").value.trim() || "null");
  } catch (exc) {
    throw localError("the payload is not valid JSON", "payload", exc.message);
  }
  if (JSON.stringify(payload) !== JSON.stringify(t.payload)) changes.payload = payload;
  return changes;
}
