// Small DOM helpers. Every value that came from the API or the user goes into the page as
// textContent or an attribute, never parsed as HTML.

export const $ = (id) => document.getElementById(id);

export function el(tag, props = {}, ...children) {
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

const SVG = "http://www.w3.org/2000/svg";
export function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

export function showError(box, error) {
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

export function clearError(box) {
  box.replaceChildren();
  box.hidden = true;
}

let noticeTimer = null;
export function notice(text) {
  const box = $("notice");
  box.textContent = text;
  box.hidden = false;
  clearTimeout(noticeTimer);
  noticeTimer = setTimeout(() => (box.hidden = true), 6000);
}

// A row's button: its visible text, and a name that says which row it acts on.
export function smallButton(label, onclick, name) {
  const props = { type: "button", className: "small", text: label, "aria-label": name, onclick };
  return el("button", props);
}

// A table that scrolls inside its own box when it is wider than the page (a keyboard reaches
// it too: the box takes focus).
export function scrollBox(table, name) {
  const props = { className: "table-scroll", tabindex: "0", role: "region", "aria-label": name };
  return el("div", props, table);
}

// A reflowing table shows each cell with its column's name on a narrow screen (console.css);
// a column whose name is for screen readers only (a row's button) shows none.
export function labelCells(table) {
  const names = [...table.tHead.rows[0].cells].map((th) =>
    th.querySelector(".visually-hidden") ? "" : th.textContent,
  );
  for (const row of table.tBodies[0].rows) {
    [...row.cells].forEach((cell, i) => (cell.dataset.label = names[i] || ""));
  }
}

export function hiddenText(text) {
  return el("span", { className: "visually-hidden", text });
}

// The page's views: one shows at a time.
export function showView(id) {
  for (const view of ["sign-in-view", "list-view", "timer-view", "keys-view", "usage-view"]) {
    $(view).hidden = view !== id;
  }
}
