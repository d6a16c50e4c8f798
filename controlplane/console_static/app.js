// The thawpool console: one page, hash routes, every number fetched from the control
// plane's API with the key signed in with (session storage: gone with the tab). Text is
// set with textContent only, never parsed as HTML. What each page drew is kept in
// window.thawpoolConsole.data, and body[data-ready] names the page once it is drawn
// (the browser tests read both).
"use strict";

const KEY = "thawpool.key";
const ADMIN = "thawpool.admin";
const main = document.getElementById("main");
const timers = [];
window.thawpoolConsole = { data: {} };

// ------------------------------------------------------------------ plumbing

async function api(path, options) {
  const opts = options || {};
  const headers = { authorization: "Bearer " + (opts.key || sessionStorage.getItem(KEY)) };
  if (opts.body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(path, { method: opts.method || "GET", headers: headers,
    body: opts.body === undefined ? undefined : JSON.stringify(opts.body) });
  if (!response.ok) throw await refusal(response);
  if (response.status === 204) return null;
  const type = response.headers.get("content-type") || "";
  return type.includes("json") ? response.json() : response.text();
}

async function refusal(response) {
  let message = response.statusText;
  try { message = (await response.json()).error.message; } catch (e) { /* not JSON */ }
  const error = new Error(response.status + ": " + message + " (request id " +
                          response.headers.get("x-request-id") + ")");
  error.status = response.status;
  return error;
}

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "on") for (const [ev, fn] of Object.entries(value)) el.addEventListener(ev, fn);
    else if (value !== null && value !== undefined && value !== false) el.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

function table(columns, rows, attrs) {
  return h("table", attrs, h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c)))),
           h("tbody", {}, rows.map((row) => h("tr", {}, row.map((v) => h("td", {}, v == null ? "" : v))))));
}

function every(seconds, fn) {
  timers.push(setInterval(() => fn().catch(() => {}), seconds * 1000));
}

// Runs fn; an error (the API's status, message and request id) is shown in errorEl.
async function attempt(errorEl, fn) {
  errorEl.textContent = "";
  try { await fn(); } catch (error) { errorEl.textContent = error.message; }
}

function split(traffic) {
  return Object.entries(traffic).map(([r, p]) => r + "=" + p + "%").join(" ");
}

// ------------------------------------------------------------------ sign in, routes

function showSignIn(message) {
  document.getElementById("nav").hidden = true;
  main.replaceChildren(document.getElementById("sign-in").content.cloneNode(true));
  document.getElementById("sign-in-error").textContent = message || "";
  document.getElementById("sign-in-form").addEventListener("submit", signIn);
  document.body.dataset.ready = "sign-in";
}

async function signIn(event) {
  event.preventDefault();
  const key = document.getElementById("key").value.trim();
  try {
    await api("/v1/deployments", { key: key });
  } catch (error) {
    if (error.status !== 403) return showSignIn(error.message);   // 403: valid, no deploy scope
  }
  sessionStorage.setItem(KEY, key);
  sessionStorage.setItem(ADMIN, await isAdmin(key) ? "1" : "");
  location.hash = "#/deployments";
  route();
}

async function isAdmin(key) {
  try { await api("/v1/tenants", { key: key }); return true; } catch (e) { return false; }
}

function signOut() {
  sessionStorage.clear();
  location.hash = "";
  showSignIn();
}

async function route() {
  timers.splice(0).forEach(clearInterval);
  if (!sessionStorage.getItem(KEY)) return showSignIn();
  document.getElementById("nav").hidden = false;
  for (const id of ["nav-admin", "nav-margin"]) document.getElementById(id).hidden = !sessionStorage.getItem(ADMIN);
  // a report page's window rides after "?" (#/usage?from=...&to=...): not part of its name
  const [, page, name] = (location.hash || "#/deployments").split("?")[0].split("/");
  document.body.dataset.ready = "";
  try {
    if (page === "deployments" && name) await deploymentPage(decodeURIComponent(name));
    else if (page === "adapters") await adaptersPage();
    else if (page === "usage") await usagePage();
    else if (page === "keys") await keysPage();
    else if (page === "budgets") await budgetsPage();
    else if (page === "webhooks") await webhooksPage();
    else if (page === "admin") await adminPage();
    else if (page === "margin") await marginPage();
    else await deploymentsPage();
  } catch (error) {
    if (error.status === 401) return showSignIn("the key was refused: " + error.message);
    main.replaceChildren(h("p", { class: "error", id: "page-error" }, error.message));
  }
  document.body.dataset.ready = (page || "deployments") + (name ? "/" + name : "");
}

// ------------------------------------------------------------------ deployments

async function deploymentsPage() {
  const listed = (await api("/v1/deployments")).data;
  window.thawpoolConsole.data.deployments = listed.map((d) => d.name);
  const stateCells = {};
  const rows = listed.map((d) => {
    stateCells[d.name] = h("td", { class: "state" }, "…");
    return h("tr", { "data-name": d.name },
      h("td", {}, h("a", { href: "#/deployments/" + encodeURIComponent(d.name) }, d.name)),
      stateCells[d.name], h("td", {}, split(d.traffic)), h("td", {}, d.revisions.length),
      h("td", {}, d.revisions.length ? d.revisions[d.revisions.length - 1].model_uri : ""));
  });
  main.replaceChildren(h("h1", {}, "Deployments"),
    h("table", { id: "deployments-table" },
      h("thead", {}, h("tr", {}, ["name", "state", "traffic", "revisions", "model"].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows)),
    listed.length ? "" : h("p", {}, "No deployments yet: thawpool deploy NAME --model MODEL"));
  const refresh = async () => {
    for (const d of listed) stateCells[d.name].textContent = stateWord(await api("/v1/deployments/" + d.name));
  };
  await refresh();
  every(5, refresh);
}

function stateWord(deployment) {
  const status = deployment.status || {};
  return [...new Set(Object.keys(deployment.traffic).map((r) => (status[r] || {}).state))].join(", ");
}

async function deploymentPage(name) {
  const path = "/v1/deployments/" + encodeURIComponent(name);
  const [deployment, activity] = await Promise.all([
    api(path), api("/v1/console/deployments/" + encodeURIComponent(name) + "/activity")]);
  const live = h("div", { id: "live" });
  const sparks = ["requests", "ttft", "tokens"].map((id) => h("div", { class: "chart card", id: "spark-" + id }));
  main.replaceChildren(h("h1", {}, deployment.name),
    h("p", {}, "scaling: " + JSON.stringify(deployment.scaling)), live,
    h("h2", {}, "Last hour"), h("div", { class: "grid" }, sparks),
    h("h2", {}, "Cold starts"), waterfall(activity.thaws));
  const drawLive = async (d) => live.replaceChildren(revisionsTable(d), replicasTable(d));
  await drawLive(deployment);
  drawSparklines(activity, sparks);
  window.thawpoolConsole.data.deployment = { deployment: deployment, activity: activity };
  every(3, async () => drawLive(await api(path)));
}

function revisionsTable(d) {
  const status = d.status || {};
  return table(["revision", "traffic", "state", "replicas", "queued", "model", "architecture", "GPUs", "memory", "last error"],
    d.revisions.map((r) => {
      const s = status[r.name] || {};
      return [r.name, (d.traffic[r.name] || 0) + "%", s.state, (s.replicas || []).length, s.queued_requests,
              r.model_uri, r.architecture, r.resources.gpu_count, r.resources.gpu_memory_gb + " GB", s.last_error];
    }), { id: "revisions-table" });
}

function replicasTable(d) {
  const rows = Object.entries(d.status || {}).flatMap(([rev, s]) => (s.replicas || []).map((r) =>
    [r.replica_id.slice(0, 12), rev, r.state, r.since, r.in_flight,
     r.state === "sleeping" ? "(given back)" : (r.slot_ids || []).join(",")]));
  return table(["replica", "revision", "state", "since", "in flight", "slots"],
               rows.length ? rows : [["-", "", "scaled to zero", "", "", ""]], { id: "replicas-table" });
}

// download_load: a thaw recorded before its lifetime kept the loading start (one stage).
// adapter_load: a call that waited only for its LoRA adapter's load into a warm replica.
const STAGES = ["queue", "placement", "download", "load", "download_load", "adapter_load", "first_token"];
const OPTIONAL_STAGES = ["download_load", "adapter_load"];

function waterfall(thaws) {
  const shown = STAGES.filter((s) => !OPTIONAL_STAGES.includes(s) || thaws.some((t) => t.stages[s] != null));
  const total = (t) => STAGES.reduce((sum, s) => sum + (t.stages[s] || 0), 0);
  const longest = Math.max(0.001, ...thaws.map(total));
  const bars = thaws.map((t) => {
    const bar = h("div", { class: "bar", title: t.replica_id });
    for (const stage of shown) {
      const seg = h("div", { class: "seg seg-" + stage, "data-stage": stage, title: stage + " " + (t.stages[stage] || 0).toFixed(2) + "s" });
      seg.style.width = (100 * (t.stages[stage] || 0) / longest) + "%";
      bar.append(seg);
    }
    const what = t.kind === "adapter" ? "  adapter " + t.adapter : "";
    return h("div", {}, h("small", {}, t.started_at.slice(0, 19) + "  " + total(t).toFixed(1) + "s" + what), bar);
  });
  return h("div", { class: "card waterfall", id: "waterfall" },
    h("div", { class: "legend" }, shown.map((s) => h("span", { class: "seg-" + s }, " " + s + " "))),
    bars.length ? bars : h("p", {}, "No cold start yet."));
}

// Every minute of the window gets a point (0 requests, no TTFT where none came), so a
// sparkline spans the whole hour whatever the traffic was.
function drawSparklines(activity, [requests, ttft, tokens]) {
  const first = Math.ceil(Date.parse(activity.since) / 60000) * 60;
  const xs = Array.from({ length: 61 }, (_, i) => first + 60 * i);
  const seen = Object.fromEntries(activity.minutes.map((m) => [Date.parse(m.at) / 1000, m]));
  const at = (x, pick, none) => (seen[x] ? pick(seen[x]) : none);
  charts.lineChart(requests, xs, xs.map((x) => at(x, (m) => m.requests / 60, 0)), "requests/s");
  charts.lineChart(ttft, xs, xs.map((x) => at(x, (m) => m.ttft_s, null)), "TTFT (s)");
  charts.lineChart(tokens, xs, xs.map((x) => at(x, (m) => m.tokens / 60, 0)), "tokens/s");
}

// ------------------------------------------------------------------ adapters

async function adaptersPage() {
  const adapters = (await api("/v1/adapters")).data;
  const error = h("p", { class: "error", id: "adapter-error" });
  const remove = (name) => attempt(error, async () => {
    await api("/v1/adapters/" + encodeURIComponent(name), { method: "DELETE" });
    await route();
  });
  main.replaceChildren(h("h1", {}, "Adapters"),
    h("p", {}, "Your LoRA adapters; a call names one as its model (base:name)."),
    table(["name", "base", "model", "rank", "size", "created", ""], adapters.map((a) =>
      [a.name, a.base + (a.base_shared ? " (shared)" : ""), a.model, a.rank, megabytes(a.weight_bytes),
       a.created_at.slice(0, 19),
       h("button", { type: "button", "data-delete": a.name, on: { click: () => remove(a.name) } }, "Delete")]),
      { id: "adapters-table" }), error,
    adapters.length ? "" : h("p", {}, "No adapters yet: thawpool adapters push DIR --base DEPLOYMENT"));
  window.thawpoolConsole.data.adapters = adapters.map((a) => a.name);
}

function megabytes(bytes) {
  return (bytes / 1048576).toFixed(2) + " MB";
}

// ------------------------------------------------------------------ usage

function isoDay(date) { return date.toISOString().slice(0, 10); }

async function usagePage() {
  const [from, to] = windowOf(new URLSearchParams(location.hash.split("?")[1] || ""));
  const range = "from=" + from + "&to=" + to;
  const [daily, report] = await Promise.all([api("/v1/console/usage?" + range),
                                             api("/v1/billing/report?group_by=day&" + range)]);
  const panels = ["tokens", "cost", "gpu"].map((id) => h("div", { class: "chart card", id: "chart-" + id }));
  main.replaceChildren(h("h1", {}, "Usage"), rangeForm("usage", from, to),
    h("div", {}, panels), reportTable(report),
    h("button", { id: "csv", type: "button", on: { click: () => downloadCsv(range, from, to) } }, "Download CSV"));
  window.thawpoolConsole.data.usage = drawUsage(daily, report, panels);
}

// The window [from, to) of a report page, and its other choices (`more`: named inputs).
function rangeForm(page, from, to, more) {
  const fromInput = h("input", { type: "date", id: "from", value: from });
  const toInput = h("input", { type: "date", id: "to", value: to });
  const extra = Object.entries(more || {});
  return h("form", { class: "inline", id: "range", on: { submit: (event) => {
    event.preventDefault();
    location.hash = "#/" + page + "?from=" + fromInput.value + "&to=" + toInput.value +
      extra.map(([name, input]) => "&" + name + "=" + encodeURIComponent(input.value)).join("");
  } } }, "from", fromInput, "to (exclusive)", toInput, extra.map(([, input]) => input),
  h("button", { type: "submit" }, "Show"));
}

function windowOf(params) {
  const tomorrow = new Date(Date.now() + 86400000);
  const to = params.get("to") || isoDay(tomorrow);
  return [params.get("from") || isoDay(new Date(Date.parse(to) - 30 * 86400000)), to];
}

function drawUsage(daily, report, [tokensEl, costEl, gpuEl]) {
  const pick = (column, parse) => Object.fromEntries(Object.entries(daily.deployments)
    .map(([name, s]) => [name, s[column].map(parse)]));
  const tokens = Object.fromEntries(Object.entries(daily.deployments).map(([name, s]) =>
    [name, s.prompt_tokens.map((p, i) => p + s.completion_tokens[i])]));
  const cost = pick("cost", parseFloat);
  const byDay = Object.fromEntries(report.rows.map((r) => [r.key, r]));
  const gpu = daily.days.map((d) => parseFloat((byDay[d] || {}).gpu_seconds || 0));
  charts.stackedChart(tokensEl, daily.days, tokens, "tokens per day, by deployment");
  charts.stackedChart(costEl, daily.days, cost, "cost per day, by deployment");
  charts.lineChart(gpuEl, charts.dayStamps(daily.days), gpu, "GPU seconds per day", 180);
  return { days: daily.days, tokens: tokens, cost: cost, gpu_seconds: gpu, report: report };
}

const REPORT_COLUMNS = ["requests", "prompt_tokens", "cached_tokens", "completion_tokens",
                        "items", "function_gpu_seconds", "token_cost", "gpu_seconds", "gpu_cost",
                        "cost"];

function reportTable(report) {
  const rows = report.rows.map((r) => [r.key, ...REPORT_COLUMNS.map((c) => r[c])]);
  rows.push(["TOTAL", ...REPORT_COLUMNS.map((c) => report.totals[c])]);
  return table(["day", ...REPORT_COLUMNS], rows, { id: "report-table" });
}

async function downloadCsv(range, from, to) {
  const text = await api("/v1/billing/report?group_by=day&format=csv&" + range);
  const link = h("a", { href: URL.createObjectURL(new Blob([text], { type: "text/csv" })),
                        download: "thawpool-usage-" + from + "-" + to + ".csv", id: "csv-link" }, "csv");
  document.body.append(link);
  link.click();
  window.thawpoolConsole.data.csv = text;
}

// ------------------------------------------------------------------ margin (operator)

// What the tenants were billed against what their GPU time cost the platform, and what
// drives the cost per 1k tokens (docs/margin.md): the API's figures as they come.
const MARGIN_COLUMNS = [["revenue", "revenue"], ["gpu_cost", "GPU cost"], ["margin", "margin"],
  ["margin_pct", "margin %"], ["gpu_seconds", "GPU s"], ["idle_gpu_seconds", "idle GPU s"],
  ["tokens", "tokens"], ["cost_per_1k_tokens", "cost / 1k tokens"], ["cache_hit_rate", "cache hit rate"],
  ["mean_batch_size", "mean batch"], ["quantization", "quantization"], ["sleep_share", "sleep share"],
  ["gpu_kinds", "GPU kinds"]];

async function marginPage() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const [from, to] = windowOf(params);
  const groupBy = params.get("group_by") === "tenant" ? "tenant" : "deployment";
  const [report, costs] = await Promise.all([
    api("/v1/billing/margin?from=" + from + "&to=" + to + "&group_by=" + groupBy), api("/v1/gpu-costs")]);
  const grouping = h("select", { id: "group-by", name: "group_by" },
    ["deployment", "tenant"].map((g) => h("option", { value: g, selected: g === groupBy }, "by " + g)));
  main.replaceChildren(h("h1", {}, "Margin"), rangeForm("margin", from, to, { group_by: grouping }),
    marginTable(report, groupBy),
    h("h2", {}, "GPU cost book"),
    h("p", {}, "What one GPU-second of each kind costs the platform (no kind: the default)."),
    costForm(), table(["GPU kind", "per GPU-second", "effective from"], costs.data.map((r) =>
      [r.gpu_kind || "(default)", r.per_gpu_second, r.effective_from]), { id: "costs-table" }));
  window.thawpoolConsole.data.margin = report;
  window.thawpoolConsole.data.costs = costs.data;
}

function marginTable(report, groupBy) {
  const cell = (v) => Array.isArray(v) ? v.join("+") : (v == null ? "-" : v);
  const rows = report.rows.map((r) => [r.key, ...MARGIN_COLUMNS.map(([c]) => cell(r[c]))]);
  rows.push(["TOTAL", ...MARGIN_COLUMNS.map(([c]) => cell(report.totals[c]))]);
  return table([groupBy, ...MARGIN_COLUMNS.map(([, title]) => title)], rows, { id: "margin-table" });
}

function costForm() {
  const inputs = [h("input", { id: "cost-kind", name: "gpu_kind", placeholder: "GPU kind (blank: default)" }),
                  h("input", { id: "cost-value", name: "per_gpu_second", placeholder: "per GPU-second", required: true }),
                  h("input", { id: "cost-from", name: "effective_from", placeholder: "effective from (blank: now)" })];
  const error = h("p", { class: "error", id: "cost-error" });
  const form = h("form", { class: "inline", id: "cost-form", on: { submit: (event) => {
    event.preventDefault();
    const body = Object.fromEntries(inputs.filter((i) => i.value.trim()).map((i) => [i.name, i.value.trim()]));
    attempt(error, async () => { await api("/v1/gpu-costs", { method: "POST", body: body }); await route(); });
  } } }, inputs, h("button", { type: "submit" }, "Add cost"));
  return h("div", {}, form, error);
}

// ------------------------------------------------------------------ admin

async function adminPage() {
  const [tenants, book] = await Promise.all([api("/v1/tenants"), api("/v1/price-book")]);
  const detail = h("div", { id: "tenant-detail" });
  const name = h("input", { id: "tenant-name", placeholder: "new tenant", required: true });
  const error = h("p", { class: "error", id: "tenant-error" });
  main.replaceChildren(h("h1", {}, "Admin"),
    h("form", { class: "inline", id: "tenant-form", on: { submit: (event) => {
      event.preventDefault();
      attempt(error, async () => {
        await api("/v1/tenants", { method: "POST", body: { name: name.value } });
        route();
      });
    } } }, name, h("button", { type: "submit" }, "Create tenant")), error,
    table(["tenant", "id", "created", ""], tenants.data.map((t) => [t.name, t.id, t.created_at.slice(0, 19),
      h("button", { type: "button", "data-tenant": t.name, on: { click: () => tenantDetail(t.name, detail) } }, "keys & quota")]),
      { id: "tenants-table" }),
    detail, h("h2", {}, "Price book"), priceForm(),
    table(["tenant", "deployment", "effective from", "input/Mtok", "output/Mtok", "GPU second"],
      book.data.map((r) => [r.tenant || "(default)", r.adapter ? r.deployment + ":" + r.adapter : r.deployment,
                            r.effective_from,
                            (r.prices || {}).input_per_mtok, (r.prices || {}).output_per_mtok, (r.prices || {}).gpu_second]),
      { id: "prices-table" }));
  window.thawpoolConsole.data.admin = { tenants: tenants.data.map((t) => t.name) };
}

// A row of the price book: the default (no tenant), a tenant's plan (no deployment), a
// deployment's override or a tenant's adapter's price, in effect from now. Blank prices
// are left to the API's defaults.
const PRICE_INPUTS = { tenant: "tenant (blank: default)", deployment: "deployment (blank: plan)",
  adapter: "adapter (blank: none)",
  input_per_mtok: "input/Mtok", output_per_mtok: "output/Mtok", gpu_second: "GPU second" };

function priceForm() {
  const inputs = Object.entries(PRICE_INPUTS).map(([field, hint]) =>
    h("input", { id: "price-" + field, name: field, placeholder: hint }));
  const error = h("p", { class: "error", id: "price-error" });
  const form = h("form", { class: "inline", id: "price-form", on: { submit: (event) => {
    event.preventDefault();
    const body = Object.fromEntries(inputs.filter((i) => i.value.trim()).map((i) => [i.name, i.value.trim()]));
    attempt(error, async () => { await api("/v1/price-book", { method: "POST", body: body }); await route(); });
  } } }, inputs, h("button", { type: "submit" }, "Add price"));
  return h("div", {}, form, error);
}

async function tenantDetail(tenant, el) {
  const [keys, quota] = await Promise.all([api("/v1/tenants/" + tenant + "/keys"),
                                           api("/v1/tenants/" + tenant + "/quota")]);
  const scopes = h("input", { id: "key-scopes", value: "invoke,deploy,billing:read" });
  const secret = h("p", { class: "secret", id: "new-key", hidden: true });
  const error = h("p", { class: "error", id: "key-error" });
  el.replaceChildren(h("h2", {}, "Tenant " + tenant),
    keysTable(keys.data, () => tenantDetail(tenant, el)),
    h("form", { class: "inline", id: "key-form", on: { submit: (event) => {
      event.preventDefault();
      attempt(error, async () => {
        const made = await api("/v1/tenants/" + tenant + "/keys", { method: "POST",
          body: { scopes: scopes.value.split(",").filter(Boolean) } });
        secret.textContent = made.key + "  (shown once: copy it now)";
        secret.hidden = false;
      });
    } } }, "scopes", scopes, h("button", { type: "submit" }, "Create key")), error, secret,
    h("h3", {}, "Quota"), quotaForm(tenant, quota, () => tenantDetail(tenant, el)));
  document.body.dataset.ready = "admin/" + tenant;
}

// Each limit's override: a whole number, or blank for the default; the egress grant: its
// "host:port" entries, comma-separated. Only changed ones are sent; the API checks them
// (its refusal is shown under the table).
function quotaForm(tenant, quota, redraw) {
  const overrides = quota.overrides || {};
  const shown = (v) => v == null ? "" : String(v);          // an array shows comma-separated
  const inputs = Object.keys(quota.limits).map((k) => h("input", { name: k, "data-limit": k,
    inputmode: k === "egress" ? "text" : "numeric", placeholder: "default", value: shown(overrides[k]) }));
  const error = h("p", { class: "error", id: "quota-error" });
  const form = h("form", { id: "quota-form", on: { submit: (event) => {
    event.preventDefault();
    const changed = inputs.filter((i) => i.value.trim() !== shown(overrides[i.name]));
    const body = Object.fromEntries(changed.map((i) => [i.name, i.name === "egress" ?
      hostList(i.value) : wholeOrText(i.value.trim())]));
    attempt(error, async () => {
      await api("/v1/tenants/" + tenant + "/quota", { method: "PATCH", body: body });
      await redraw();
    });
  } } }, table(["limit", "in effect", "override"], Object.entries(quota.limits).map(([k, v], i) =>
    [k, v === null ? "none" : shown(v), inputs[i]]), { id: "quota-table" }),
    h("button", { type: "submit", id: "quota-save" }, "Save quota"));
  return h("div", {}, form, error);
}

function hostList(value) {
  const hosts = value.split(",").map((x) => x.trim()).filter(Boolean);
  return hosts.length ? hosts : null;
}

function wholeOrText(value) {
  if (value === "") return null;
  return /^\d+$/.test(value) ? Number(value) : value;
}

// ------------------------------------------------------------------ keys

async function keysPage() {
  const keys = (await api("/v1/keys")).data;
  main.replaceChildren(h("h1", {}, "API keys"),
    h("p", {}, "Your tenant's keys. A revoked key is refused from then on; new keys come from the operator."),
    keysTable(keys, route));
  window.thawpoolConsole.data.keys = keys.map((k) => k.prefix);
}

function keysTable(keys, redraw) {
  const error = h("p", { class: "error", id: "revoke-error" });
  const revoke = (prefix) => attempt(error, async () => {
    await api("/v1/keys/" + encodeURIComponent(prefix), { method: "DELETE" });
    await redraw();
  });
  const signedIn = (k) => (sessionStorage.getItem(KEY) || "").startsWith(k.prefix + "_");
  return h("div", {}, table(["prefix", "name", "scopes", "expires", "revoked", ""], keys.map((k) =>
    [k.prefix, [k.name, signedIn(k) ? "(this session's key)" : ""].filter(Boolean).join(" "),
     k.scopes.join(","), k.expires_at, k.revoked_at, k.revoked_at ? "" :
      h("button", { type: "button", "data-revoke": k.prefix, on: { click: () => revoke(k.prefix) } }, "Revoke")]),
    { id: "keys-table" }), error);
}

// ------------------------------------------------------------------ budgets

// The caller's budgets with this period's spend (an operator sees every tenant's), a form
// that sets one (PUT /v1/budgets: the API checks every field) and a delete per row.
async function budgetsPage() {
  const admin = !!sessionStorage.getItem(ADMIN);
  const budgets = (await api("/v1/budgets")).data;
  const error = h("p", { class: "error", id: "budget-error" });
  const remove = (id) => attempt(error, async () => {
    await api("/v1/budgets/" + encodeURIComponent(id), { method: "DELETE" });
    await route();
  });
  const rows = budgets.map((b) => [b.scope, b.scope_name || b.scope_id, b.limit, b.period, b.time_zone, b.spent, b.reserved,
    b.remaining, b.current_period.start.slice(0, 16), b.alerts.map((a) => a.kind).join(","),
    b.scope === "tenant" && !admin ? "set by the operator" :
      h("button", { type: "button", "data-delete-budget": b.id, on: { click: () => remove(b.id) } }, "Delete")]);
  main.replaceChildren(h("h1", {}, "Budgets"),
    h("p", {}, "Money limits per period on your tenant (set by the operator), your keys and your deployments. " +
      "A call past one is refused with 429 budget_exceeded before any replica starts."),
    table(["scope", "on", "limit", "period", "time zone", "spent", "reserved", "remaining", "period start",
           "alerts", ""], rows, { id: "budgets-table" }),
    h("h3", {}, "Set a budget"), budgetForm(admin, error), error);
  window.thawpoolConsole.data.budgets = budgets;
}

function budgetForm(admin, error) {
  const scopes = (admin ? ["tenant", "key", "deployment"] : ["deployment", "key"]).map((s) => h("option", { value: s }, s));
  const periods = ["month", "day", "none"].map((p) => h("option", { value: p }, p));
  const field = (name, placeholder) => h("input", { name: name, id: "budget-" + name, placeholder: placeholder });
  const inputs = { scope: h("select", { name: "scope", id: "budget-scope" }, scopes),
    tenant: admin ? field("tenant", "tenant name") : null,
    target: field("target", "deployment name or key prefix"),
    limit: field("limit", "limit, e.g. 25.00"),
    period: h("select", { name: "period", id: "budget-period" }, periods),
    time_zone: field("time_zone", "UTC"), soft_fraction: field("soft_fraction", "soft share, e.g. 0.8") };
  const body = () => {
    const scope = inputs.scope.value;
    const out = { scope: scope, limit: inputs.limit.value.trim(), period: inputs.period.value,
                  time_zone: inputs.time_zone.value.trim() || "UTC" };
    if (inputs.tenant) out.tenant = inputs.tenant.value.trim();
    if (scope !== "tenant") out[scope] = inputs.target.value.trim();
    if (inputs.soft_fraction.value.trim()) out.soft_fraction = inputs.soft_fraction.value.trim();
    return out;
  };
  return h("form", { id: "budget-form", class: "inline", on: { submit: (event) => {
    event.preventDefault();
    attempt(error, async () => {
      await api("/v1/budgets", { method: "PUT", body: body() });
      await route();
    });
  } } }, Object.values(inputs).filter(Boolean), h("button", { type: "submit", id: "budget-save" }, "Save budget"));
}

// ------------------------------------------------------------------ webhooks

// The caller's webhook endpoints (an operator's key: every one), a form to add one (its
// secret is shown once, here: `newSecret`, drawn with the page that lists it), and per
// endpoint its deliveries with every attempt.
async function webhooksPage(newSecret) {
  const listed = (await api("/v1/webhooks")).data;
  const url = h("input", { id: "webhook-url", placeholder: "https://hooks.example.com/thawpool", required: true, size: 40 });
  const events = h("input", { id: "webhook-events", value: "budget.threshold" });
  const secret = h("p", { class: "secret", id: "new-webhook-secret", hidden: !newSecret },
    newSecret ? newSecret + "  (shown once: the receiver verifies Thawpool-Signature with it)" : "");
  const error = h("p", { class: "error", id: "webhook-error" });
  const deliveries = h("div", { id: "webhook-deliveries" });
  const form = h("form", { class: "inline", id: "webhook-form", on: { submit: (event) => {
    event.preventDefault();
    attempt(error, async () => {
      const made = await api("/v1/webhooks", { method: "POST", body: {
        url: url.value.trim(), event_types: events.value.split(",").map((e) => e.trim()).filter(Boolean) } });
      await webhooksPage(made.secret);
    });
  } } }, "URL", url, "events", events, h("button", { type: "submit" }, "Add endpoint"));
  main.replaceChildren(h("h1", {}, "Webhooks"),
    h("p", {}, "Signed events POSTed to your URLs (docs/webhooks.md): each delivery is retried with backoff and every attempt is kept."),
    form, error, secret, webhooksTable(listed, deliveries, error), deliveries);
  window.thawpoolConsole.data.webhooks = listed.map((e) => e.id);
  document.body.dataset.ready = "webhooks";
}

function webhooksTable(listed, deliveries, error) {
  const act = (fn) => () => attempt(error, fn);
  const test = (id) => act(async () => {
    await api("/v1/webhooks/" + id + "/test", { method: "POST" });
    await showDeliveries(id, deliveries);
  });
  const toggle = (e) => act(async () => {
    await api("/v1/webhooks/" + e.id, { method: "PATCH", body: { enabled: !e.enabled } });
    await webhooksPage();
  });
  const remove = (id) => act(async () => {
    await api("/v1/webhooks/" + id, { method: "DELETE" });
    await webhooksPage();
  });
  return table(["url", "events", "enabled", "created", ""], listed.map((e) => [e.url, e.event_types.join(","),
    e.enabled ? "yes" : "no", e.created_at.slice(0, 19), h("span", {},
      h("button", { type: "button", "data-deliveries": e.id, on: { click: act(() => showDeliveries(e.id, deliveries)) } }, "Deliveries"),
      h("button", { type: "button", "data-test": e.id, on: { click: test(e.id) } }, "Send test"),
      h("button", { type: "button", "data-toggle-webhook": e.id, on: { click: toggle(e) } }, e.enabled ? "Disable" : "Enable"),
      h("button", { type: "button", "data-delete-webhook": e.id, on: { click: remove(e.id) } }, "Delete"))]),
    { id: "webhooks-table" });
}

async function showDeliveries(id, el) {
  const listed = (await api("/v1/webhooks/" + id + "/deliveries?limit=50")).data;
  const last = (d) => d.last_status_code != null ? String(d.last_status_code) : (d.last_error || "");
  el.replaceChildren(h("h2", {}, "Deliveries"),
    table(["created", "event", "type", "status", "attempts", "last answer", "next attempt"],
      listed.map((d) => [d.created_at.slice(0, 19), d.event_id, d.event_type, d.status, d.attempts, last(d),
                         d.next_attempt_at ? d.next_attempt_at.slice(0, 19) : ""]),
      { id: "deliveries-table", "data-endpoint": id }));
  window.thawpoolConsole.data.deliveries = listed.map((d) => ({ id: d.id, status: d.status, attempts: d.attempts }));
  document.body.dataset.ready = "webhooks";
}

document.getElementById("sign-out").addEventListener("click", signOut);
// Whether tenants' code runs in the sandbox, as /readyz says (no key needed): an operator
// who turned it off (THAWPOOL_SANDBOX=off) sees it on every page.
async function showSandbox() {
  const badge = document.getElementById("sandbox");
  try {
    const mode = (await (await fetch("/readyz")).json()).sandbox;
    badge.textContent = mode === "off" ? "sandbox OFF: tenants' code runs unconfined" : "sandbox: " + mode;
    badge.classList.toggle("off", mode === "off");
  } catch (e) { badge.textContent = "sandbox: unknown"; }
}

window.addEventListener("hashchange", route);
showSandbox();
route();
