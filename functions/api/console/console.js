// The tenant console: plain JS, no framework, no build step. Served with a CSP that allows
// only this file, so everything the page does is here. Every value that came from the API or
// the user is put in the page with textContent or an attribute, never parsed as HTML.
"use strict";

const API = new URL(".", document.baseURI); // the page is /v1/console: the API is /v1/
const KEY_ITEM = "timers.apiKey"; // sessionStorage: gone with the tab, never in a URL
const PREVIEW_DELAY_MS = 350; // debounce: preview once the user pauses typing
const POLL_MS = 2000; // the timer page refreshes its fires while it is open
const PREVIEW_COUNT = 5;
const CHART_FIRES = 100;

const $ = (id) => document.getElementById(id);

// ------------------------------------------------------------------ the API

class ApiError extends Error {
  constructor(status, body) {
    const error = body && body.error;
    // API Gateway's own throttle answers {"message": ...}; anything else has the contract's body.
    super((error && error.message) || (body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.code = (error && error.code) || "";
    this.details = (error && Array.isArray(error.details) && error.details) || [];
  }
}

function localError(message, field, detail) {
  return new ApiError(0, { error: { code: "local", message, details: [{ field, message: detail }] } });
}

function currentKey() {
  return sessionStorage.getItem(KEY_ITEM) || "";
}

async function api(method, path, body, key = currentKey()) {
  const init = { method, headers: { "x-api-key": key }, cache: "no-store" };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(new URL(path, API), init);
  } catch (exc) {
    throw new ApiError(0, { error: { message: "the API did not answer (network error)" } });
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (exc) {
    data = null;
  }
  if (!response.ok) {
    const failure = new ApiError(response.status, data);
    if (response.status === 401 && key === currentKey() && key) {
      signOut("The API no longer accepts this key: sign in again.");
    }
    throw failure;
  }
  return data;
}

// A path segment: ids are URL-safe already; a fire id's ":" is legal in a path and kept.
function segment(value) {
  return encodeURIComponent(value).replace(/%3A/gi, ":");
}

function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(name, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

// ------------------------------------------------------------------ small DOM helpers

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name === "text") node.textContent = value;
    else if (name === "className") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) {
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
  }
  return node;
}

function showError(box, error) {
  box.replaceChildren(el("p", { className: "message", text: error.message }));
  // A 400's message already names its fields: list only what it leaves out.
  const details = (error.details || []).filter(
    (d) => d && (d.field || d.message) && !error.message.includes(`${d.field}: ${d.message}`),
  );
  if (details.length) {
    box.append(el("ul", {}, ...details.map((d) => el("li", { text: `${d.field}: ${d.message}` }))));
  }
  box.dataset.code = error.code || "";
  box.hidden = false;
}

// A row's button: its visible text, and a name that says which row it acts on.
function smallButton(label, onclick, name) {
  const props = { type: "button", className: "small", text: label, "aria-label": name, onclick };
  return el("button", props);
}

// A table that scrolls inside its own box when it is wider than the page (a keyboard reaches
// it too: the box takes focus).
function scrollBox(table, name) {
  const props = { className: "table-scroll", tabindex: "0", role: "region", "aria-label": name };
  return el("div", props, table);
}

function redeliverButton(timerId, fireId) {
  return smallButton("Redeliver", () => redeliver(timerId, fireId), `Redeliver fire ${fireId}`);
}

// A reflowing table shows each cell with its column's name on a narrow screen (console.css);
// a column whose name is for screen readers only (a row's button) shows none.
function labelCells(table) {
  const names = [...table.tHead.rows[0].cells].map((th) =>
    th.querySelector(".visually-hidden") ? "" : th.textContent,
  );
  for (const row of table.tBodies[0].rows) {
    [...row.cells].forEach((cell, i) => (cell.dataset.label = names[i] || ""));
  }
}

function hiddenText(text) {
  return el("span", { className: "visually-hidden", text });
}

function orDash(value) {
  return value === null || value === undefined ? "—" : String(value);
}

function clearError(box) {
  box.replaceChildren();
  box.hidden = true;
}

let noticeTimer = null;
function notice(text) {
  const box = $("notice");
  box.textContent = text;
  box.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => (box.hidden = true), 6000);
}

const relativeFormat = new Intl.RelativeTimeFormat("en", { numeric: "auto" });
function relative(iso) {
  const seconds = (Date.parse(iso) - Date.now()) / 1000;
  const units = [["day", 86400], ["hour", 3600], ["minute", 60]];
  for (const [unit, size] of units) {
    if (Math.abs(seconds) >= size) return relativeFormat.format(Math.round(seconds / size), unit);
  }
  return relativeFormat.format(Math.round(seconds), "second");
}

function timeCell(iso, zone) {
  if (!iso) return el("td", { text: "—" });
  const local = new Date(iso).toLocaleString();
  const shown = el("time", { datetime: iso, text: iso });
  const inZone = zone ? el("span", { className: "zone", text: ` (${wallClock(iso, zone)})` }) : "";
  return el("td", { title: `${local} (${relative(iso)})` }, shown, inZone);
}

// A cron is written in its time zone: its times are shown there too, beside UTC.
function zoneOf(schedule) {
  const zone = schedule && schedule.type === "cron" ? schedule.timezone : null;
  return zone && zone !== "UTC" ? zone : null;
}

function wallClock(iso, zone) {
  try {
    const parts = {};
    const format = new Intl.DateTimeFormat("en-US", {
      timeZone: zone, year: "numeric", month: "2-digit", day: "2-digit",
      hour: "2-digit", minute: "2-digit", hourCycle: "h23",
    });
    for (const part of format.formatToParts(new Date(iso))) parts[part.type] = part.value;
    return `${parts.year}-${parts.month}-${parts.day} ${parts.hour}:${parts.minute} ${zone}`;
  } catch (exc) {
    return zone; // a zone this browser does not know
  }
}

// No next fire while paused: resuming decides it (the timer's misfire policy).
function nextFireCell(timer) {
  if (timer.status === "paused") return el("td", { className: "paused-next", text: "— (paused)" });
  return timeCell(timer.next_fire_at, zoneOf(timer.schedule));
}

function nextFireText(timer) {
  if (timer.status === "paused") return "— (paused)";
  if (!timer.next_fire_at) return "—";
  const zone = zoneOf(timer.schedule);
  return zone ? `${timer.next_fire_at} (${wallClock(timer.next_fire_at, zone)})` : timer.next_fire_at;
}

function describeSchedule(schedule) {
  switch (schedule.type) {
    case "at":
      return `at ${schedule.at}`;
    case "after":
      return `after ${schedule.seconds} s`;
    case "cron":
      return `cron ${schedule.expression} (${schedule.timezone})`;
    case "every":
      return `every ${schedule.seconds} s`;
    default:
      return JSON.stringify(schedule);
  }
}

function describeTarget(target) {
  if (!target) return "—";
  if (target.url) return `POST ${target.url}`;
  return target.queue_url || "—";
}

// ------------------------------------------------------------------ sign in and out

async function signIn(event) {
  event.preventDefault();
  const key = $("api-key").value.trim();
  clearError($("sign-in-error"));
  try {
    const me = await api("GET", "tenant", undefined, key);
    sessionStorage.setItem(KEY_ITEM, key);
    $("api-key").value = "";
    showTenant(me);
    route();
  } catch (error) {
    showError($("sign-in-error"), error);
  }
}

function showTenant(me) {
  $("whoami").textContent = `Tenant ${me.tenant}`;
  for (const id of ["whoami", "sign-out", "nav-keys", "nav-usage"]) $(id).hidden = false;
}

function signOut(reason) {
  sessionStorage.removeItem(KEY_ITEM);
  stopPolling();
  list.timers = [];
  list.cursor = null;
  failed.available = null;
  for (const id of ["whoami", "sign-out", "nav-keys", "nav-usage"]) $(id).hidden = true;
  $("new-key").hidden = true;
  $("new-key-secret").textContent = "";
  showView("sign-in-view");
  if (reason) showError($("sign-in-error"), new ApiError(401, { error: { message: reason } }));
  else clearError($("sign-in-error"));
  $("api-key").focus();
}

// ------------------------------------------------------------------ views

function showView(id) {
  for (const view of ["sign-in-view", "list-view", "timer-view", "keys-view", "usage-view"]) {
    $(view).hidden = view !== id;
  }
}

function route() {
  stopPolling();
  if (!currentKey()) {
    showView("sign-in-view");
    return;
  }
  if (location.hash === "#/keys") {
    page.id = null;
    showView("keys-view");
    loadKeys();
    return;
  }
  if (location.hash.startsWith("#/usage")) {
    page.id = null;
    showView("usage-view");
    loadUsage();
    return;
  }
  const match = /^#\/timers\/(.+)$/.exec(location.hash);
  if (match) {
    if (failed.available === null) loadFailed(true); // whether to offer Redeliver
    let id;
    try {
      id = decodeURIComponent(match[1]);
    } catch (exc) {
      id = match[1]; // a malformed escape: the API answers 404 for it
    }
    openTimer(id);
  } else {
    page.id = null;
    showView("list-view");
    if (!list.loaded) loadTimers(true);
    loadGroups();
    loadFailed(true);
    schedulePreview();
  }
}

// ------------------------------------------------------------------ the timers list

const list = { timers: [], cursor: null, loaded: false };

async function loadTimers(reset) {
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
    list.timers.push(...page.items);
    list.cursor = page.next_cursor;
    list.loaded = true;
  } catch (error) {
    showError($("timers-error"), error);
  }
  renderTimers();
}

function renderTimers() {
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

// ------------------------------------------------------------------ groups

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

async function loadGroups() {
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

function showGroupActions(group) {
  $("group-actions").hidden = !group;
  $("group-actions-label").textContent = group ? `Group ${group}:` : "";
}

const GROUP_ACTIONS = {
  pause: { method: "POST", suffix: "/pause", done: "Paused", question: "Pause every timer of group" },
  resume: { method: "POST", suffix: "/resume", done: "Resumed", question: "Resume every timer of group" },
  delete: { method: "DELETE", suffix: "", done: "Deleted", question: "Delete every timer of group" },
};
const groupAction = { action: null, group: null };

function confirmGroup(action) {
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

async function onGroupConfirmClosed() {
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

// ------------------------------------------------------------------ create, with a live preview

function numberOrText(input) {
  // A number when it reads as one; otherwise the text as typed, for the API to name the field.
  const raw = input.value.trim();
  if (raw === "") return null;
  const value = Number(raw);
  return Number.isFinite(value) ? value : raw;
}

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

function showKind() {
  const kind = $("kind").value;
  for (const label of document.querySelectorAll("[data-kind]")) label.hidden = label.dataset.kind !== kind;
  if (kind === "at" && !$("at-time").value) {
    $("at-time").value = new Date(Date.now() + 60_000).toISOString().replace(/\.\d+Z$/, "Z");
  }
}

let previewTimer = null;
let previewSeq = 0;
function schedulePreview() {
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

async function createTimer(event) {
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

// ------------------------------------------------------------------ one timer

const page = {
  id: null,
  timer: null,
  fires: [],
  cursor: null,
  pagedBeyondFirst: false,
  poll: null,
  refreshing: null,
};

function stopPolling() {
  clearInterval(page.poll);
  page.poll = null;
}

async function openTimer(id) {
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

function refreshTimer() {
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

async function moreFires() {
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

// ------------------------------------------------------------------ edit, reset, run now

function fillEdit(t) {
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
function readEdit(t) {
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

async function saveEdit(event) {
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

async function resetTimer() {
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

async function runNow() {
  clearError($("timer-error"));
  try {
    const fire = await api("POST", `timers/${segment(page.id)}/run`);
    notice(`Fired ${fire.fire_id}`);
    refreshTimer();
  } catch (error) {
    showError($("timer-error"), error);
  }
}

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

function renderFires() {
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

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
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

async function act(action) {
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

function confirmDelete() {
  const dialog = $("confirm-dialog");
  const name = page.timer && page.timer.name ? ` (${page.timer.name})` : "";
  $("confirm-text").textContent = `Delete timer ${page.id}${name}? It will never fire again.`;
  dialog.returnValue = "";
  dialog.showModal();
}

async function onConfirmClosed() {
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

// ------------------------------------------------------------------ keys

async function loadKeys() {
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

async function createKey(event) {
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

// ------------------------------------------------------------------ usage

async function loadUsage() {
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

// ------------------------------------------------------------------ failed fires
// The routes may not exist on an older deployment: a 404 hides the panel and the buttons.

const failed = { available: null, items: [], cursor: null };
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

async function loadFailed(reset) {
  if (failed.available === false) return;
  if (reset) {
    failed.items = [];
    failed.cursor = null;
  }
  clearError($("failed-error"));
  try {
    const answer = await api("GET", `fires${failedQuery(failed.cursor)}`);
    failed.available = true;
    failed.items.push(...answer.items);
    failed.cursor = answer.next_cursor;
  } catch (error) {
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

async function redeliver(timerId, fireId) {
  try {
    await api("POST", `timers/${segment(timerId)}/fires/${segment(fireId)}/redeliver`);
    notice(`Redelivering ${fireId}`);
    afterRedelivery();
  } catch (error) {
    showError(page.id ? $("timer-error") : $("failed-error"), error);
  }
}

async function redeliverAll(timerId) {
  try {
    const answer = await api("POST", `timers/${segment(timerId)}/fires:redeliver`);
    notice(`Redelivering ${answer.items.length} fires of ${timerId}`);
    afterRedelivery();
  } catch (error) {
    showError(page.id ? $("timer-error") : $("failed-error"), error);
  }
}

function afterRedelivery() {
  if (!$("timer-view").hidden) refreshTimer();
  loadFailed(true); // a redelivered fire is a failure no more: the API leaves it out of the list
}

// ------------------------------------------------------------------ wiring

function fillTimeZones() {
  const zones = typeof Intl.supportedValuesOf === "function" ? Intl.supportedValuesOf("timeZone") : [];
  $("time-zones").replaceChildren(...["UTC", ...zones].map((zone) => el("option", { value: zone })));
}

function start() {
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
    api("GET", "tenant").then(showTenant, () => {}); // a refused key signs out in api()
  }
  route();
}

start();
