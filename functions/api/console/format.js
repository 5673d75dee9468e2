// Times, schedules and targets as the page shows them.

import { el } from "./dom.js";

export function orDash(value) {
  return value === null || value === undefined ? "—" : String(value);
}

const relativeFormat = new Intl.RelativeTimeFormat("en", { numeric: "auto" });
export function relative(iso) {
  const seconds = (Date.parse(iso) - Date.now()) / 1000;
  const units = [["day", 86400], ["hour", 3600], ["minute", 60]];
  for (const [unit, size] of units) {
    if (Math.abs(seconds) >= size) return relativeFormat.format(Math.round(seconds / size), unit);
  }
  return relativeFormat.format(Math.round(seconds), "second");
}

export function timeCell(iso, zone) {
  if (!iso) return el("td", { text: "—" });
  const local = new Date(iso).toLocaleString();
  const shown = el("time", { datetime: iso, text: iso });
  const inZone = zone ? el("span", { className: "zone", text: ` (${wallClock(iso, zone)})` }) : "";
  return el("td", { title: `${local} (${relative(iso)})` }, shown, inZone);
}

// A cron is written in its time zone: its times are shown there too, beside UTC.
export function zoneOf(schedule) {
  const zone = schedule && schedule.type === "cron" ? schedule.timezone : null;
  return zone && zone !== "UTC" ? zone : null;
}

export function wallClock(iso, zone) {
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
export function nextFireCell(timer) {
  if (timer.status === "paused") return el("td", { className: "paused-next", text: "— (paused)" });
  return timeCell(timer.next_fire_at, zoneOf(timer.schedule));
}

export function nextFireText(timer) {
  if (timer.status === "paused") return "— (paused)";
  if (!timer.next_fire_at) return "—";
  const zone = zoneOf(timer.schedule);
  return zone ? `${timer.next_fire_at} (${wallClock(timer.next_fire_at, zone)})` : timer.next_fire_at;
}

export function describeSchedule(schedule) {
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

export function describeTarget(target) {
  if (!target) return "—";
  if (target.url) return `POST ${target.url}`;
  return target.queue_url || "—";
}
