// What the console holds between events, shared by the modules that show or change it (and by
// sign-out, which forgets it).

// The timers list: the pages loaded so far, the cursor of the next, whether it is up to date
// (a change made elsewhere in the page sets loaded to false: the list reloads when shown).
export const list = { timers: [], cursor: null, loaded: false };

// The open timer's page (id null when none is open): the timer, its fires loaded so far, and
// the polling that refreshes them.
export const page = {
  id: null,
  timer: null,
  fires: [],
  cursor: null,
  pagedBeyondFirst: false,
  poll: null,
  refreshing: null,
};

// The failed fires. available: null until the API first answers, false when it has no such
// routes (an older deployment: a 404 hides the panel and the Redeliver buttons).
export const failed = { available: null, items: [], cursor: null };

// Loads of one list overlap (a filter changed while a page is on its way; the timer page's
// check for failed fires, then the list's own load): each load takes a ticket, and only the
// newest ticket's answer is kept - an older one would land beside it. A new ticket drops the
// answers still on their way.
export function newestOnly() {
  let newest = 0;
  return () => {
    const mine = ++newest;
    return () => mine === newest;
  };
}
