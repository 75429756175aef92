// task.html's row filter: by outcome and by task id, over the rows table, the variants table
// and the sections. `?only=failed&task=sentiment` in the page's address presets it.
(function () {
  "use strict";
  var form = document.getElementById("filter");
  var status = document.getElementById("filter-status");
  var text = document.getElementById("filter-text");
  var count = document.getElementById("filter-count");
  var items = document.querySelectorAll("[data-category]");
  var rows = document.querySelectorAll("table.summary tr[data-category]");
  var params = new URLSearchParams(window.location.search);
  status.value = params.get("only") || "";
  text.value = params.get("task") || "";

  function shown(item) {
    var category = item.getAttribute("data-category");
    var wanted = status.value;
    var byOutcome = !wanted || category === wanted || (wanted === "failed" && category === "error");
    var task = (item.getAttribute("data-task") || "").toLowerCase();
    return byOutcome && task.indexOf(text.value.trim().toLowerCase()) !== -1;
  }

  function apply() {
    items.forEach(function (item) { item.hidden = !shown(item); });
    var visible = Array.prototype.filter.call(rows, function (row) { return !row.hidden; }).length;
    count.textContent = visible + " of " + rows.length + " rows shown";
  }

  status.addEventListener("change", apply);
  text.addEventListener("input", apply);
  form.addEventListener("submit", function (event) { event.preventDefault(); });
  form.hidden = false;
  apply();
})();
