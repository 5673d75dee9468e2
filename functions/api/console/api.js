// The API client: the key this tab signed in with, each call with it, the contract's errors,
// and the pieces of a path and query. It knows no view: main.js says what a refused key does.

const API = new URL(".", document.baseURI); // the page is /v1/console: the API is /v1/
const KEY_ITEM = "timers.apiKey"; // sessionStorage: gone with the tab, never in a URL

export class ApiError extends Error {
  constructor(status, body) {
    const error = body && body.error;
    // API Gateway's own throttle answers {"message": ...}; anything else has the contract's body.
    super((error && error.message) || (body && body.message) || `HTTP ${status}`);
    this.status = status;
    this.code = (error && error.code) || "";
    this.details = (error && Array.isArray(error.details) && error.details) || [];
  }
}

export function localError(message, field, detail) {
  return new ApiError(0, { error: { code: "local", message, details: [{ field, message: detail }] } });
}

export function currentKey() {
  return sessionStorage.getItem(KEY_ITEM) || "";
}

export function keepKey(key) {
  sessionStorage.setItem(KEY_ITEM, key);
}

export function forgetKey() {
  sessionStorage.removeItem(KEY_ITEM);
}

let keyRefused = () => {};
// What a 401 for the key in use does (sign out): set by main.js, since the sign-in view
// imports this module.
export function onKeyRefused(handler) {
  keyRefused = handler;
}

export async function api(method, path, body, key = currentKey()) {
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
    if (response.status === 401 && key === currentKey() && key) keyRefused();
    throw failure;
  }
  return data;
}

// A path segment: ids are URL-safe already; a fire id's ":" is legal in a path and kept.
export function segment(value) {
  return encodeURIComponent(value).replace(/%3A/gi, ":");
}

export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(name, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}
