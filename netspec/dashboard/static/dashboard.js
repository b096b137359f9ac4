// netspec dashboard: the runs list refreshes itself; a run page draws its curves with plotly.js and
// adds each metrics line the server streams (server-sent events) without reloading; its state, buttons,
// snapshots and per-class table refresh themselves too (the table at once when a test pass brings figures).
// Test outputs are charted by kind (losses, accuracies, others), never on one axis, and a loss chart can be
// switched to a log scale.  The Datasets page follows its conversions' progress; a model's page sends an
// image the person chooses to the model and shows its top classes.
"use strict";

const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const DASHES = ["solid", "dash", "dot", "dashdot"];
// the run page's charts (pages.py places them) and their titles
const CHARTS = [["chart-loss", "train loss (smoothed)"], ["chart-test", "test losses"],
                ["chart-accuracy", "test accuracy (and outputs in [0, 1])"], ["chart-other", "other test outputs"],
                ["chart-lr", "learning rate"]];
const KIND_CHARTS = { loss: "chart-test", accuracy: "chart-accuracy", other: "chart-other" }; // see outputKind
const shown = new Map(); // run -> {events, source}: the runs drawn on this page
let ownRun = null; // the run whose page this is
let eventKeys = new Set(); // keys of an event that are not net outputs
let drawPending = false;

function forgetToken() {
  // the server has set the token's cookie: keep the token out of the address bar and the history
  const url = new URL(window.location.href);
  if (url.searchParams.has("token")) {
    url.searchParams.delete("token");
    window.history.replaceState(null, "", url);
  }
}

async function fetchPage(address) {
  // the page at address, parsed; null when it cannot be had (the dashboard stopped, say)
  try {
    const response = await fetch(address);
    if (!response.ok) return null;
    return new DOMParser().parseFromString(await response.text(), "text/html");
  } catch (error) {
    return null;
  }
}

async function refreshRuns() {
  const page = await fetchPage(window.location.pathname);
  const rows = page && page.querySelector("#runs tbody");
  if (rows) document.querySelector("#runs tbody").replaceWith(rows);
}

async function refreshRun() {
  // a run page's state, message, buttons, per-class table and snapshots as they are now (the run started,
  // stopped, snapshotted, tested)
  const page = await fetchPage(window.location.href);
  if (!page) return;
  for (const id of ["run-state", "run-message", "per-class", "snapshots"]) {
    const fresh = page.getElementById(id);
    if (fresh) document.getElementById(id).replaceWith(fresh);
  }
  for (const button of document.querySelectorAll("button[data-action]")) {
    const fresh = page.querySelector(`button[data-action="${button.dataset.action}"]`);
    if (fresh) button.disabled = fresh.disabled;
  }
}

function query(run) {
  return "run=" + encodeURIComponent(run);
}

function noteDamaged(run, damaged) {
  const list = document.getElementById("damaged");
  for (const line of damaged) {
    const item = document.createElement("li");
    item.dataset.run = run;
    item.textContent = `${run}: metrics.jsonl line ${line.line} skipped: ${line.reason}`;
    list.appendChild(item);
  }
}

function forgetDamaged(run) {
  for (const item of document.querySelectorAll("#damaged li")) {
    if (item.dataset.run === run) item.remove();
  }
}

// draw a run and follow its metrics; "listed": the page already names its damaged lines
async function addRun(run, listed) {
  const entry = { events: [], source: null };
  shown.set(run, entry);
  const response = await fetch("api/runs/metrics?" + query(run));
  if (!response.ok || shown.get(run) !== entry) return;
  const data = await response.json();
  entry.events = data.events;
  if (!listed) noteDamaged(run, data.damaged);
  scheduleDraw();
  entry.source = new EventSource(`api/runs/stream?${query(run)}&since=${data.position}`);
  entry.source.addEventListener("metrics", (message) => {
    const chunk = JSON.parse(message.data);
    entry.events = entry.events.concat(chunk.events);
    noteDamaged(run, chunk.damaged);
    scheduleDraw();
    if (run === ownRun && chunk.events.some((event) => event.per_class)) refreshRun(); // the page's table
  });
  entry.source.addEventListener("reset", () => {
    removeRun(run); // the file was rewritten (a resumed run): read it again
    addRun(run, false);
  });
}

function removeRun(run) {
  const entry = shown.get(run);
  if (entry && entry.source) entry.source.close();
  shown.delete(run);
  forgetDamaged(run);
  scheduleDraw();
}

function scheduleDraw() {
  if (drawPending) return;
  drawPending = true;
  window.setTimeout(() => { drawPending = false; draw(); }, 250);
}

function formatNumber(value) {
  // a value for a label: four significant digits, no trailing zeros
  return String(Number(value.toPrecision(4)));
}

function outputKind(name, values) {
  // the chart a test output goes on: "loss" when named so, "accuracy" when named so or when every value is in
  // [0, 1] (error rates, precisions), else "other"; losses and fractions on one axis would flatten one another
  const lower = name.toLowerCase();
  if (lower.includes("loss")) return "loss";
  if (lower.includes("accuracy")) return "accuracy";
  const known = values.filter(Number.isFinite);
  return known.length && known.every((value) => value >= 0 && value <= 1) ? "accuracy" : "other";
}

function yAxis(values, log) {
  // the y axis of a chart of values (null: gaps), and a note for the chart (empty when none): a log scale when
  // asked for and every value is above 0, else linear; a flat series on an axis of its value +- 10 % (+- 1 for
  // 0) labelled with it, where Plotly would put it on an axis of its value +- 1
  let low = Infinity, high = -Infinity;
  for (const value of values) {
    if (!Number.isFinite(value)) continue;
    low = Math.min(low, value);
    high = Math.max(high, value);
  }
  const refused = log && low <= 0;
  const axis = { type: log && !refused ? "log" : "linear" };
  const note = refused ? "log scale refused: values ≤ 0 (drawn linear)" : "";
  if (low === high) {
    const pad = low === 0 ? 1 : Math.abs(low) / 10;
    axis.tickvals = [low - pad, low, low + pad];
    axis.ticktext = axis.tickvals.map(formatNumber);
    axis.range = axis.type === "log" ? [Math.log10(low - pad), Math.log10(low + pad)] : [low - pad, low + pad];
  }
  return { axis, note };
}

function line(name, events, key, colour, dash, markers) {
  const kept = events.filter((event) => key in event);
  const y = kept.map((event) => event[key]);
  const trace = { type: "scatter", mode: markers ? "lines+markers" : "lines", name,
                  x: kept.map((event) => event.iter), y, line: { color: colour, dash } };
  if (y.filter(Number.isFinite).length === 1) { // a line through one point draws nothing: a dot, and its value
    const text = y.map((value) => (Number.isFinite(value) ? formatNumber(value) : ""));
    Object.assign(trace, { mode: "markers+text", text, textposition: "top center", cliponaxis: false,
                           marker: { color: colour, size: 8 } });
  }
  return trace;
}

function logScale(chart) {
  // whether chart's log scale switch (a loss chart's) is on
  const toggle = document.querySelector(`input.log-scale[data-chart="${chart}"]`);
  return toggle !== null && toggle.checked;
}

function drawChart(chart, title, traces) {
  const element = document.getElementById(chart);
  const box = element.parentElement;
  if ("optional" in box.dataset) box.hidden = !traces.length; // shown once it has something to show
  if (box.hidden) return;
  const { axis, note } = yAxis(traces.flatMap((trace) => trace.y), logScale(chart));
  const notes = note ? [{ text: note, xref: "paper", yref: "paper", x: 1, y: 1, xanchor: "right", yanchor: "bottom",
                          showarrow: false, font: { color: "#c92a2a" } }] : [];
  Plotly.react(element, traces, { title: { text: title, x: 0 }, margin: { t: 40, r: 20, b: 40, l: 60 },
                                  xaxis: { title: { text: "iteration" } }, yaxis: axis, annotations: notes,
                                  showlegend: true }, { responsive: true });
}

function draw() {
  const charts = new Map(CHARTS.map(([chart]) => [chart, []]));
  let index = 0;
  for (const [run, { events }] of shown) {
    const colour = COLOURS[index++ % COLOURS.length];
    const train = events.filter((event) => event.phase === "TRAIN");
    charts.get("chart-loss").push(line(`${run}: loss`, train, "smoothed_loss", colour, "solid", false));
    charts.get("chart-lr").push(line(run, train, "lr", colour, "solid", false));
    const tested = events.filter((event) => event.phase === "TEST");
    const series = new Set();
    for (const event of tested) {
      for (const key of Object.keys(event)) if (!eventKeys.has(key)) series.add(`${event.test_net}\t${key}`);
    }
    let dash = 0;
    for (const name of series) {
      const [net, key] = name.split("\t");
      const label = `${run}: ${key}` + (net === "0" ? "" : ` (test net ${net})`);
      const ofNet = tested.filter((event) => String(event.test_net) === net);
      const trace = line(label, ofNet, key, colour, DASHES[dash++ % DASHES.length], true);
      charts.get(KIND_CHARTS[outputKind(key, trace.y)]).push(trace);
    }
  }
  for (const [chart, title] of CHARTS) drawChart(chart, title, charts.get(chart));
}

function remembered(key) {
  try {
    return window.localStorage.getItem(key);
  } catch (error) {
    return null; // (storage refused: a private window, say)
  }
}

function remember(key, value) {
  try {
    window.localStorage.setItem(key, value);
  } catch (error) {
    // not kept: the switch holds for this page only
  }
}

function followScaleSwitches() {
  // each loss chart's log scale switch, as this browser last left it
  for (const toggle of document.querySelectorAll("input.log-scale")) {
    const key = `netspec-dashboard:log-scale:${toggle.dataset.chart}`;
    toggle.checked = remembered(key) === "1";
    toggle.addEventListener("change", () => {
      remember(key, toggle.checked ? "1" : "0");
      draw();
    });
  }
}

function rememberOverlays(page) {
  const url = new URL(window.location.href);
  url.searchParams.delete("with");
  for (const run of shown.keys()) if (run !== page) url.searchParams.append("with", run);
  window.history.replaceState(null, "", url);
}

async function act(button) {
  const result = document.getElementById("action-result");
  try {
    const response = await fetch(`api/runs/${button.dataset.action}?${query(button.dataset.run)}`,
                                 { method: "POST" });
    result.textContent = await response.text();
  } catch (error) {
    result.textContent = `no answer from the dashboard: ${error.message}`;
  }
  window.setTimeout(refreshRun, 1000); // the training acts on the signal at its next iteration
}

function startRunPage(charts) {
  eventKeys = new Set(JSON.parse(charts.dataset.eventKeys));
  followScaleSwitches();
  const [page, ...overlaid] = JSON.parse(charts.dataset.runs);
  ownRun = page;
  addRun(page, true);
  for (const run of overlaid) addRun(run, false);
  for (const box of document.querySelectorAll("input.overlay")) {
    box.addEventListener("change", () => {
      if (box.checked) addRun(box.value, false); else removeRun(box.value);
      rememberOverlays(page);
    });
  }
  for (const button of document.querySelectorAll("button[data-action]")) {
    button.addEventListener("click", () => act(button));
  }
  window.setInterval(refreshRun, 5000);
}

function showConversions(list) {
  const items = document.getElementById("conversion-list");
  items.replaceChildren();
  for (const conversion of list) {
    const item = document.createElement("li");
    item.className = `conversion conversion-${conversion.state}`;
    const title = document.createElement("div");
    title.textContent = `${conversion.source} → ${conversion.out}: ${conversion.state}`;
    const bar = document.createElement("progress");
    bar.max = Math.max(conversion.total, 1);
    bar.value = conversion.state === "finished" ? bar.max : conversion.done;
    const count = document.createElement("span");
    count.textContent = ` ${conversion.done} / ${conversion.total || "?"} images`;
    item.append(title, bar, count);
    if (conversion.message) {
      const message = document.createElement("p");
      message.textContent = conversion.message;
      item.appendChild(message);
    }
    for (const skipped of conversion.skipped) {
      const line = document.createElement("p");
      line.className = "damaged";
      line.textContent = `skipped ${skipped}`;
      item.appendChild(line);
    }
    items.appendChild(item);
  }
  if (!list.length) items.textContent = "none started from this dashboard";
}

function followConversions(section) {
  // show the conversions' progress, once a second while one runs; a finished one's dataset joins the table
  const runningIn = (list) => list.filter((conversion) => conversion.state === "running").length;
  const shown = JSON.parse(section.dataset.conversions);
  let running = runningIn(shown);
  const follow = async () => {
    let list;
    try {
      const response = await fetch("api/datasets/conversions");
      list = response.ok ? await response.json() : null;
    } catch (error) {
      list = null;
    }
    if (list === null) { // the dashboard is busy or gone: ask again later
      window.setTimeout(follow, 5000);
      return;
    }
    showConversions(list);
    const now = runningIn(list);
    if (now < running) {
      const page = await fetchPage("datasets");
      const rows = page && page.querySelector("#datasets tbody");
      if (rows) document.querySelector("#datasets tbody").replaceWith(rows);
    }
    running = now;
    if (running) window.setTimeout(follow, 1000);
  };
  showConversions(shown);
  if (running) window.setTimeout(follow, 1000);
}

function cell(row, text) {
  const element = document.createElement("td");
  element.textContent = text;
  row.appendChild(element);
}

async function predict(form) {
  const file = document.getElementById("predict-file").files[0];
  const note = document.getElementById("predict-note");
  const table = document.getElementById("predictions");
  if (!file) return;
  const image = document.getElementById("predict-image");
  if (image.src) URL.revokeObjectURL(image.src);
  image.src = URL.createObjectURL(file);
  image.hidden = false;
  table.replaceChildren();
  note.textContent = "predicting…";
  let answer;
  try {
    const response = await fetch(`api/models/predict?ref=${encodeURIComponent(form.dataset.ref)}` +
                                 `&name=${encodeURIComponent(file.name)}`,
                                 { method: "POST", body: file,
                                   headers: { "content-type": "application/octet-stream" } });
    answer = response.headers.get("content-type").startsWith("application/json")
      ? await response.json() : { error: await response.text() };
  } catch (error) {
    answer = { error: `no answer from the dashboard: ${error.message}` };
  }
  if (answer.error) {
    note.textContent = answer.error;
    return;
  }
  note.textContent = answer.note;
  const head = document.createElement("tr");
  for (const title of ["class", "label", "probability"]) {
    const element = document.createElement("th");
    element.textContent = title;
    head.appendChild(element);
  }
  table.appendChild(head);
  for (const prediction of answer.predictions) {
    const row = document.createElement("tr");
    cell(row, prediction.name);
    cell(row, String(prediction.label));
    cell(row, `${(100 * prediction.probability).toFixed(1)} %`);
    table.appendChild(row);
  }
}

forgetToken();
if (document.getElementById("runs")) window.setInterval(refreshRuns, 5000);
const charts = document.getElementById("charts");
if (charts) startRunPage(charts);
const conversions = document.getElementById("conversions");
if (conversions) followConversions(conversions);
const predictForm = document.getElementById("predict-form");
if (predictForm) {
  predictForm.addEventListener("submit", (event) => {
    event.preventDefault();
    predict(predictForm);
  });
}
