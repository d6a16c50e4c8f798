// Charts over uPlot (vendored). Stacking: each series is drawn as the running sum of
// itself and the ones before it, filled, the largest first, so every band shows its share.
"use strict";

const PALETTE = ["#2b7de9", "#f0a202", "#2e9e5b", "#b3261e", "#7b3fe4", "#0f9ea8", "#d1495b"];

function dayStamps(days) {
  return days.map((d) => Date.parse(d + "T00:00:00Z") / 1000);
}

function stackedChart(el, days, byName, label) {
  const names = Object.keys(byName).sort();
  const running = days.map(() => 0);
  const stacked = names.map((name) => byName[name].map((v, i) => (running[i] += v)));
  const order = names.map((_, i) => i).reverse();         // tallest band drawn first
  const series = [{}].concat(order.map((i) => ({
    label: names[i], stroke: PALETTE[i % PALETTE.length],
    fill: PALETTE[i % PALETTE.length] + "99",
    points: { show: true, size: 7, fill: PALETTE[i % PALETTE.length] } })));
  const data = [dayStamps(days)].concat(order.map((i) => stacked[i]));
  return draw(el, { title: label, series: series, height: 220 }, data);
}

function lineChart(el, xs, ys, label, height) {
  const series = [{}, { label: label, stroke: PALETTE[0], fill: PALETTE[0] + "33",
                        points: { show: true, size: 7, fill: PALETTE[0] } }];
  return draw(el, { title: label, series: series, height: height || 120 }, [xs, ys]);
}

function draw(el, opts, data) {
  el.textContent = "";
  const width = Math.max(200, (el.clientWidth || 360) - 40);     // inside the card's padding
  return new uPlot(Object.assign({ width: width, axes: [{}, { size: 60 }] }, opts), data, el);
}

window.charts = { stackedChart, lineChart, dayStamps };
