// tilesweep's page: sort the summary table by a column, filter it by problem axes, and open
// the folded group of a problem linked from the table. No library, no network.
// The page's query string sets the initial state: ?sort=speedup&order=desc&dtype=bfloat16
(function () {
  "use strict";
  var table = document.getElementById("summary");
  if (!table) { return; }
  // the filters and the sorting hint work only with this script: it shows them
  Array.prototype.forEach.call(document.querySelectorAll(".controls[hidden]"), function (c) { c.hidden = false; });
  var tbody = table.tBodies[0];
  var rows = Array.prototype.slice.call(tbody.rows);
  var heads = Array.prototype.slice.call(table.tHead.rows[0].cells);
  var filters = Array.prototype.slice.call(document.querySelectorAll("select[data-col]"));
  var shown = document.getElementById("shown");
  var current = {col: -1, desc: false};

  function value(row, col, num) {
    var cell = row.cells[col];
    var v = cell.getAttribute("data-v");
    if (v === null) { v = cell.textContent; }
    if (num) { var x = parseFloat(v); return isNaN(x) ? null : x; }
    return v === "-" ? null : v;
  }

  function sortBy(col, desc) {
    var num = heads[col].hasAttribute("data-num");
    var keyed = rows.map(function (r, i) { return [value(r, col, num), i, r]; });
    keyed.sort(function (a, b) {
      var x = a[0], y = b[0];
      if (x === null || y === null) {  // no value: always last, in document order
        return x === y ? a[1] - b[1] : (x === null ? 1 : -1);
      }
      var c = num ? x - y : String(x).localeCompare(String(y), undefined, {numeric: true});
      if (c === 0) { return a[1] - b[1]; }
      return desc ? -c : c;
    });
    var frag = document.createDocumentFragment();
    keyed.forEach(function (k) { frag.appendChild(k[2]); });
    tbody.appendChild(frag);
    heads.forEach(function (h, i) {
      if (i === col) { h.setAttribute("aria-sort", desc ? "descending" : "ascending"); }
      else { h.removeAttribute("aria-sort"); }
    });
    current = {col: col, desc: desc};
  }

  function applyFilters() {
    var active = filters.filter(function (s) { return s.value !== ""; });
    var n = 0;
    rows.forEach(function (r) {
      var ok = active.every(function (s) {
        return value(r, parseInt(s.getAttribute("data-col"), 10), false) === s.value;
      });
      r.hidden = !ok;
      if (ok) { n += 1; }
    });
    if (shown) { shown.textContent = String(n); }
  }

  heads.forEach(function (h, i) {
    if (!h.hasAttribute("data-key")) { return; }
    h.tabIndex = 0;
    var go = function () { sortBy(i, current.col === i ? !current.desc : h.hasAttribute("data-desc")); };
    h.addEventListener("click", go);
    h.addEventListener("keydown", function (e) { if (e.key === "Enter") { go(); } });
  });
  filters.forEach(function (s) { s.addEventListener("change", applyFilters); });

  function openTo(hash) {
    var el = hash && hash.length > 1 ? document.getElementById(hash.slice(1)) : null;
    for (var p = el; p; p = p.parentElement) {
      if (p.tagName === "DETAILS") { p.open = true; }
    }
    if (el) { el.scrollIntoView(); }
  }
  window.addEventListener("hashchange", function () { openTo(location.hash); });

  var params = new URLSearchParams(location.search);
  filters.forEach(function (s) {
    var want = params.get(s.name);
    // a value the select does not list (a hand-edited link) leaves the filter at "all", shown so
    var known = Array.prototype.some.call(s.options, function (o) { return o.value === want; });
    if (want !== null && known) { s.value = want; }
  });
  applyFilters();
  var key = params.get("sort");
  if (key) {
    var col = heads.findIndex(function (h) { return h.getAttribute("data-key") === key; });
    if (col >= 0) { sortBy(col, params.get("order") === "desc"); }
  }
  if (location.hash) { openTo(location.hash); }

  // printed, the page holds every problem: the folded groups and lists open for the print, and
  // those that were closed close again after it
  var reopened = [];
  window.addEventListener("beforeprint", function () {
    reopened = Array.prototype.filter.call(document.querySelectorAll("details"), function (d) { return !d.open; });
    reopened.forEach(function (d) { d.open = true; });
  });
  window.addEventListener("afterprint", function () {
    reopened.forEach(function (d) { d.open = false; });
    reopened = [];
  });
})();
