// The console's few scripts: times in the browser's zone, the capacity choice following the instance
// type and subnets, and a job's log followed by polling. Everything works without them, less handily.
"use strict";

function showLocalTimes(root) {
  const format = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", timeZoneName: "short",
  });
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  if (!zone || zone === "UTC" || zone === "Etc/UTC") return;
  for (const element of root.querySelectorAll("time[datetime]")) {
    if (element.dataset.local) continue;
    element.dataset.local = "1";
    const local = document.createElement("span");
    local.className = "local-time";
    local.textContent = " (" + format.format(new Date(element.getAttribute("datetime"))) + ")";
    element.after(local);
  }
}

function followCapacityChoices() {
  const form = document.getElementById("cluster-form");
  if (!form) return;
  const zonesChosen = () => {
    const boxes = [...form.querySelectorAll('input[name="subnets"]:checked'), ...form.querySelectorAll(".cluster-subnet")];
    return new Set(boxes.map((box) => box.dataset.zone).filter(Boolean));
  };
  const update = () => {
    const zones = zonesChosen();
    for (const group of form.querySelectorAll("fieldset.group")) {
      const type = group.querySelector('[data-role="instance-type"]').value;
      const select = group.querySelector('[data-role="capacity"]');
      for (const option of select.options) {
        if (!option.value) continue;
        const planZones = (option.dataset.zones || "").split(" ");
        const fits = option.dataset.instanceType === type && (zones.size === 0 || planZones.some((z) => zones.has(z)));
        option.hidden = !fits;
        option.disabled = !fits;
        if (!fits && option.selected) select.value = "";
      }
    }
  };
  form.addEventListener("change", update);
  update();
}

function followLog() {
  const log = document.getElementById("job-log");
  if (!log) return;
  const state = document.getElementById("log-state");
  let cursor = "";
  const poll = async () => {
    try {
      const response = await fetch(log.dataset.source + (cursor ? "?cursor=" + encodeURIComponent(cursor) : ""), {
        credentials: "same-origin", headers: { Accept: "application/json" },
      });
      if (!response.ok) {
        state.textContent = response.status === 429 ? "Too many requests: the log will be read again shortly." : "The log could not be read (" + response.status + ").";
        setTimeout(poll, 5000);
        return;
      }
      const page = await response.json();
      if (page.data) {
        const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
        log.textContent += page.data;
        if (atEnd) log.scrollTop = log.scrollHeight;
      }
      cursor = page.cursor;
      if (page.done) {
        state.textContent = "The job has ended: this is its whole log.";
        return;
      }
      state.textContent = "Following the log…";
      setTimeout(poll, page.data ? 300 : 1000);
    } catch (error) {
      state.textContent = "The log could not be read; trying again.";
      setTimeout(poll, 5000);
    }
  };
  poll();
}

document.addEventListener("DOMContentLoaded", () => {
  showLocalTimes(document);
  followCapacityChoices();
  followLog();
});
