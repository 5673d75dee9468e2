// The view the URL's hash names: #/ the list, #/timers/<id> a timer, #/keys, #/usage; the
// sign-in view while no key is kept.

import { currentKey } from "./api.js";
import { showView } from "./dom.js";
import { loadFailed } from "./failed-fires.js";
import { loadGroups } from "./groups.js";
import { loadKeys } from "./keys.js";
import { failed, list, page } from "./state.js";
import { schedulePreview } from "./timer-form.js";
import { openTimer, stopPolling } from "./timer-page.js";
import { loadTimers } from "./timers-list.js";
import { loadUsage } from "./usage.js";

export function route() {
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
