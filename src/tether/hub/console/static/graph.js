// The live cluster graph: Graph API messages (docs/graph.md §7) applied to a Cytoscape.js graph.
// Layout is our own and incremental: objects are grouped by namespace, and within a group placed in bands by
// kind, left to right (workloads, then their ReplicaSets/Jobs, then Pods, then what Pods use, then the rest).
// A new object takes the next free slot of its band, so a change never moves other objects of its group; a
// group moves only when one above it outgrows the space its grid row was given.
(function () {
  "use strict";
  const app = document.getElementById("graph-app");
  if (!app || typeof cytoscape === "undefined") return;

  const SUBPROTOCOL = "gitlab-agent-graph-api";
  const COLS = 10, DX = 150, DY = 64, BAND_GAP = 160, GROUP_GAP = 240, GROUPS_PER_ROW = 2;
  const PRESETS = {
    workloads: "(group == 'apps' && resource in ['deployments', 'replicasets', 'statefulsets', 'daemonsets']) || " +
      "(group == 'batch' && resource in ['jobs', 'cronjobs']) || (group == '' && resource == 'pods')",
    networking: "(group == '' && resource in ['services', 'pods']) || (group == 'discovery.k8s.io' && resource == " +
      "'endpointslices') || (group == 'networking.k8s.io' && resource in ['ingresses', 'networkpolicies', " +
      "'ingressclasses'])",
    config: "(group == '' && resource in ['configmaps', 'secrets', 'persistentvolumeclaims', 'persistentvolumes', " +
      "'serviceaccounts', 'pods']) || (group == 'storage.k8s.io' && resource == 'storageclasses')",
    everything: "namespaced",
  };
  const LEVEL = {
    deployments: 0, statefulsets: 0, daemonsets: 0, cronjobs: 0, services: 0, ingresses: 0,
    horizontalpodautoscalers: 0, networkpolicies: 0, poddisruptionbudgets: 0,
    replicasets: 1, jobs: 1, endpointslices: 1, endpoints: 1,
    pods: 2,
    configmaps: 3, secrets: 3, persistentvolumeclaims: 3, serviceaccounts: 3,
  };
  const LEVELS = 5;
  const BULK = 1500;   // above this many objects, arcs are drawn without arrows...
  const FAR_ZOOM = 0.3;  // ...and, with the objects' names, not at all below this zoom: painting 15,000 arcs or
                         // measuring 5,000 names costs seconds
  const COLORS = {
    deployments: "#1f6feb", statefulsets: "#1f6feb", daemonsets: "#1f6feb", replicasets: "#6f42c1",
    jobs: "#6f42c1", cronjobs: "#1f6feb", pods: "#1a7f37", services: "#bf8700", ingresses: "#bf8700",
    endpointslices: "#9a6700", configmaps: "#8c959f", secrets: "#cf222e", persistentvolumeclaims: "#0969da",
    serviceaccounts: "#57606a", namespaces: "#24292f",
  };

  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const agentId = app.dataset.agentId;
  const statusEl = document.getElementById("graph-status");
  const banner = document.getElementById("graph-banner");
  const details = document.getElementById("graph-details");
  const controls = document.getElementById("graph-controls");
  const nsSelect = document.getElementById("graph-namespace");
  const clearRoot = document.getElementById("graph-clear-root");

  const cy = cytoscape({
    container: document.getElementById("graph-canvas"),
    layout: { name: "preset" },
    minZoom: 0.02, maxZoom: 4,
    textureOnViewport: true, hideEdgesOnViewport: true, motionBlur: false, pixelRatio: 1,
    boxSelectionEnabled: false,
    style: [
      { selector: "node", style: {
        "width": 22, "height": 22, "background-color": "data(color)", "label": "data(label)",
        "font-size": 9, "min-zoomed-font-size": 7, "text-valign": "bottom", "text-margin-y": 3,
        "text-wrap": "none", "color": "#24292f" } },
      { selector: "node.group", style: {
        "shape": "round-rectangle", "background-opacity": 0, "border-width": 0, "width": 1, "height": 1,
        "label": "data(label)", "font-size": 22, "font-weight": "bold", "text-valign": "top", "text-halign": "right",
        "text-wrap": "none", "text-max-width": 2000,
        "min-zoomed-font-size": 4, "events": "no" } },
      { selector: "node:selected", style: { "border-width": 4, "border-color": "#fb8500" } },
      { selector: "node.root", style: { "shape": "star", "width": 30, "height": 30 } },
      { selector: "edge", style: {
        "width": 1.2, "curve-style": "straight", "target-arrow-shape": "triangle", "arrow-scale": 0.6,
        "line-color": "#8c959f", "target-arrow-color": "#8c959f" } },
      { selector: "edge.or", style: { "line-color": "#57606a", "target-arrow-color": "#57606a", "width": 1.6 } },
      { selector: "edge.r", style: { "line-style": "dashed", "line-color": "#0969da", "target-arrow-color": "#0969da" } },
      { selector: "edge.t", style: { "line-style": "dotted", "line-color": "#bf8700", "target-arrow-color": "#bf8700" } },
      { selector: "edge.missing", style: { "opacity": 0.35 } },
      // Big graphs: "haystack" lines draw several times faster, without arrows (details list the directions).
      { selector: "edge.bulk", style: { "curve-style": "haystack", "haystack-radius": 0 } },
      { selector: "edge.far", style: { "display": "none" } },
      { selector: "node.far", style: { "label": "" } },
    ],
  });

  // ---- model and layout -------------------------------------------------------------------------------
  let vertices = new Map();   // id -> {vx, o, j, group, level, slot}
  let arcs = new Map();       // id -> {s, d, t, a}
  let waiting = new Map();    // vertex id -> arc ids waiting for that vertex
  let groups = new Map();     // group key -> {key, rows: [[ids]], origin: {x, y}, order}
  let pending = [];           // actions not yet drawn
  let scheduled = false;
  const drawnAt = new Map();  // vertex id -> Date.now() when first drawn (benchmarks read it)
  let socket = null, nsSocket = null, generation = 0, root = null;
  let socketOpenMs = null;
  let firstDrawAt = null, lastDrawMs = null, firstMessageMs = null, lastMessageMs = null;

  const vid = (vx) => [vx.g, vx.v, vx.r, vx.ns || "", vx.n].join("/");
  const aid = (a) => vid(a.s) + ">" + a.t + ">" + vid(a.d);
  const groupKey = (vx) => vx.ns || "(cluster-scoped)";
  const level = (vx) => (vx.r in LEVEL ? LEVEL[vx.r] : 4);

  function groupOf(key) {
    let g = groups.get(key);
    if (!g) {
      g = { key, rows: Array.from({ length: LEVELS }, () => []), origin: { x: 0, y: 0 }, allotted: 0 };
      groups.set(key, g);
      placeGroups();
    }
    return g;
  }
  // A group's bands are as wide as its widest band (up to COLS slots), and empty bands take no room: small
  // graphs stay compact. That shape changes only while a group is small or a kind first appears in it; then
  // that group alone is re-placed.
  function shape(g) {
    const width = Math.max(1, Math.min(COLS, ...g.rows.map((band) => band.length)));
    const index = [];
    let next = 0;
    g.rows.forEach((band, level) => { index[level] = next; if (band.length) next += 1; });
    return { width, index, bands: Math.max(1, next) };
  }
  const GROUP_WIDTH = LEVELS * (COLS * DX + BAND_GAP);
  function groupHeight(g) {
    const { index } = shape(g);
    let rows = 1;
    g.rows.forEach((band, level) => { rows = Math.max(rows, index[level] + Math.ceil(band.length / COLS)); });
    return rows * DY + 60;
  }
  function placeGroups() {
    // Groups sorted by name on a grid; each grid row is given half again the height of its tallest group, so
    // that groups below move only when a group outgrows that.
    const sorted = [...groups.values()].sort((a, b) => a.key.localeCompare(b.key));
    let y = 0;
    for (let i = 0; i < sorted.length; i += GROUPS_PER_ROW) {
      const row = sorted.slice(i, i + GROUPS_PER_ROW);
      const height = Math.max(...row.map(groupHeight)) * 1.5;
      row.forEach((g, k) => {
        const origin = { x: k * (GROUP_WIDTH + GROUP_GAP), y };
        if (g.origin.x !== origin.x || g.origin.y !== origin.y) g.dirty = true;
        g.origin = origin;
        g.allotted = height;
      });
      y += height + GROUP_GAP;
    }
  }
  function position(v) {
    // Bands side by side, each a row lower than the one before (arcs between neighbouring bands then fan out
    // instead of running along one line); a band grows downwards.
    const g = groups.get(v.group), band = g.shape.index[v.level];
    return {
      x: g.origin.x + band * (g.shape.width * DX + BAND_GAP) + (v.slot % COLS) * DX,
      y: g.origin.y + 40 + band * DY + Math.floor(v.slot / COLS) * DY,
    };
  }
  function addToGroup(id, v) {
    const g = groupOf(v.group);
    const rows = g.rows[v.level];
    rows.push(id);   // a deleted object leaves its slot empty
    v.slot = rows.length - 1;
    const next = shape(g);
    if (!g.shape || next.width !== g.shape.width || next.bands !== g.shape.bands) g.dirty = true;
    g.shape = next;
    if (groupHeight(g) > g.allotted) placeGroups();
  }

  // ---- applying actions -----------------------------------------------------------------------------------
  function label(vx) { return vx.n; }
  function flush() {
    scheduled = false;
    const actions = pending; pending = [];
    const addNodes = [], addEdges = [], update = [];
    let addedEdges = 0;
    cy.batch(() => {
      for (const act of actions) {
        if (act.darc) {
          const id = aid(act.darc);
          arcs.delete(id);
          cy.getElementById(id).remove();
        } else if (act.dvx) {
          const id = vid(act.dvx.vx);
          const v = vertices.get(id);
          if (v) { vertices.delete(id); cy.getElementById(id).remove(); }
        } else if (act.svx) {
          const vx = act.svx.vx, id = vid(vx);
          const existing = vertices.get(id);
          if (existing) { existing.o = act.svx.o; existing.j = act.svx.j; update.push(id); continue; }
          const v = { vx, o: act.svx.o, j: act.svx.j, group: groupKey(vx), level: level(vx), slot: 0 };
          vertices.set(id, v);
          addToGroup(id, v);
          addNodes.push(id);
        } else if (act.sarc) {
          const a = act.sarc, id = aid(a);
          const known = arcs.has(id);
          arcs.set(id, a);
          if (known) { cy.getElementById(id).toggleClass("missing", !!(a.a && a.a.e)); continue; }
          addEdges.push(id);
        }
      }
      const added = new Set(addNodes);
      const nodes = [];
      for (const id of addNodes) {
        const v = vertices.get(id);
        if (!v || cy.getElementById(id).nonempty()) continue;
        nodes.push({ group: "nodes", data: { id, label: label(v.vx), color: COLORS[v.vx.r] || "#6e7781" },
          position: position(v), classes: (root === id ? "root" : "") + (arcsHidden ? " far" : "") });
      }
      for (const g of groups.values()) {
        const gid = "group:" + g.key;
        const gpos = { x: g.origin.x - DX / 2, y: g.origin.y };
        if (cy.getElementById(gid).empty()) nodes.push({ group: "nodes", data: { id: gid, label: g.key, color: "#ffffff" }, position: gpos, classes: "group" });
        else if (g.dirty) cy.getElementById(gid).position(gpos);
        if (g.dirty) {
          for (const rows of g.rows) for (const id of rows) {
            const v = vertices.get(id);
            if (v && !added.has(id)) cy.getElementById(id).position(position(v));
          }
          g.dirty = false;
        }
      }
      if (nodes.length) cy.add(nodes);
      const edges = [];
      const edgeFor = (id, a) => ({ group: "edges", data: { id, source: vid(a.s), target: vid(a.d) },
        classes: a.t + (a.a && a.a.e ? " missing" : "") + (vertices.size > BULK ? " bulk" : "") +
          (arcsHidden ? " far" : "") });
      for (const id of addEdges) {
        const a = arcs.get(id);
        if (!a) continue;
        const s = vid(a.s), d = vid(a.d);
        if (!vertices.has(s) || !vertices.has(d)) {
          // Drawn when the missing end arrives (an arc may point at an object outside the graph: "e").
          const missing = vertices.has(s) ? d : s;
          if (!waiting.has(missing)) waiting.set(missing, new Set());
          waiting.get(missing).add(id);
          continue;
        }
        edges.push(edgeFor(id, a));
      }
      for (const id of addNodes) {
        const ids = waiting.get(id);
        if (!ids) continue;
        waiting.delete(id);
        for (const arcId of ids) {
          const a = arcs.get(arcId);
          if (a && vertices.has(vid(a.s)) && vertices.has(vid(a.d)) && cy.getElementById(arcId).empty()) edges.push(edgeFor(arcId, a));
        }
      }
      if (edges.length) cy.add(edges);
      addedEdges = edges.length;
    });
    if (addNodes.length || addedEdges) {
      // Drawn means painted: Cytoscape emits "render" after it has drawn the frame with these nodes.
      const mine = generation;
      cy.one("render", () => {
        if (mine !== generation) return;
        const now = Date.now();
        for (const id of addNodes) if (!drawnAt.has(id)) drawnAt.set(id, now);
        lastDrawMs = performance.now();
      });
    }
    if (firstDrawAt === null && vertices.size) { firstDrawAt = performance.now(); cy.fit(undefined, 30); }
    updateArcVisibility();
    const selected = cy.$("node:selected");
    if (selected.nonempty() && update.includes(selected.id())) showDetails(selected.id());
    setStatus("live");
  }
  // Draw when the stream pauses (50 ms without a message) or at least once a second while it flows: a big
  // initial graph arrives in many messages, and drawing after each would repaint thousands of nodes each time.
  let pendingSince = 0;
  function tick() {
    const now = performance.now();
    if (now - lastMessageMs < 50 && now - pendingSince < 1000) { setTimeout(tick, 50); return; }
    requestAnimationFrame(flush);
  }
  // Level of detail: a big graph seen whole shows its objects; its arcs appear when zoomed in, where only the
  // visible part is painted. Each change then repaints in about a tenth of the time.
  let arcsHidden = false;
  function updateArcVisibility() {
    const hide = vertices.size > BULK && cy.zoom() < FAR_ZOOM;
    if (hide === arcsHidden) return;
    arcsHidden = hide;
    cy.batch(() => cy.elements(hide ? ":unselected" : "*").not(".group").toggleClass("far", hide));
    setStatus(statusEl.dataset.state);
  }
  let zoomPending = false;
  cy.on("zoom", () => {
    if (zoomPending) return;
    zoomPending = true;
    requestAnimationFrame(() => { zoomPending = false; updateArcVisibility(); });
  });
  function schedule() {
    if (scheduled) return;
    scheduled = true;
    pendingSince = performance.now();
    setTimeout(tick, 50);
  }

  function setStatus(state, text) {
    statusEl.dataset.state = state;
    statusEl.dataset.vertices = String(vertices.size);
    statusEl.dataset.arcs = String(cy.edges().length);
    statusEl.textContent = text || `${vertices.size} objects, ${cy.edges().length} arcs — live` +
      (arcsHidden ? " — zoom in to see the arcs" : "") +
      (root ? ` — showing what ${root.split("/").slice(2).join("/")} depends on` : "");
  }
  function showBanner(text) { banner.textContent = text; banner.hidden = !text; }

  // ---- the WebSocket ------------------------------------------------------------------------------------
  function socketUrl() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const q = new URLSearchParams({ "gitlab-agent-id": agentId, "gitlab-csrf-token": csrf });
    return `${scheme}//${location.host}${app.dataset.socketPath}?${q}`;
  }
  function celString(text) { return "'" + String(text).replace(/\\/g, "\\\\").replace(/'/g, "\\'") + "'"; }
  function request() {
    const form = new FormData(controls);
    const ns = form.get("namespace");
    const jsonPath = String(form.get("jsonpath") || "").trim();
    const object = jsonPath ? { json_path: jsonPath } : {};
    const expression = form.get("preset") === "custom" ? customQuery : PRESETS[form.get("preset")] || PRESETS.workloads;
    const req = { queries: [{ include: { resource_selector_expression: expression, object } }] };
    if (ns) req.namespaces = { names: [ns] };
    if (root) {
      const v = vertices.get(root) || { vx: rootVx };
      const vx = v.vx;
      req.roots = { object_selector_expressions: [
        `group == ${celString(vx.g)} && resource == ${celString(vx.r)} && namespace == ${celString(vx.ns || "")} && name == ${celString(vx.n)}`] };
    }
    return req;
  }
  let rootVx = null;
  let customQuery = "";
  function connect() {
    const mine = ++generation;
    if (socket) socket.close(1000);
    arcsHidden = false;
    vertices = new Map(); arcs = new Map(); waiting = new Map(); groups = new Map(); pending = []; drawnAt.clear();
    cy.elements().remove();
    firstDrawAt = null; lastDrawMs = null; firstMessageMs = null; lastMessageMs = null;
    showBanner("");
    setStatus("connecting", "Connecting to the cluster…");
    socket = new WebSocket(socketUrl(), SUBPROTOCOL);
    socket.onopen = () => { socketOpenMs = performance.now(); socket.send(JSON.stringify(request())); };
    socket.onmessage = (event) => {
      if (mine !== generation) return;
      const now = performance.now();
      if (firstMessageMs === null) firstMessageMs = now;
      lastMessageMs = now;
      const msg = JSON.parse(event.data);
      if (msg.error) { showBanner(`The graph stopped: ${msg.error.reason}`); return; }
      if (msg.warnings) showBanner("Warnings from the agent: " + msg.warnings.map((w) => w.m || w.t).join("; "));
      if (msg.actions) { for (const a of msg.actions) pending.push(a); schedule(); }
    };
    socket.onclose = (event) => {
      if (mine !== generation) return;
      setStatus("closed", `Disconnected (${event.code}${event.reason ? ": " + event.reason : ""}). ` +
        `Showing the last known state; press Apply to reconnect.`);
      if (event.code !== 1000 && banner.hidden) showBanner(`The connection to the cluster ended: ${event.reason || "code " + event.code}`);
    };
  }
  function loadNamespaces() {
    nsSocket = new WebSocket(socketUrl(), SUBPROTOCOL);
    const names = new Set();
    nsSocket.onopen = () => nsSocket.send(JSON.stringify({ queries: [{ include: {
      resource_selector_expression: "group == '' && resource == 'namespaces'", object: { json_path: "{.metadata.name}" } } }] }));
    nsSocket.onmessage = (event) => {
      const msg = JSON.parse(event.data);
      for (const a of msg.actions || []) {
        if (a.svx) names.add(a.svx.vx.n); else if (a.dvx) names.delete(a.dvx.vx.n);
      }
      const current = nsSelect.value;
      const wanted = ["", ...[...names].sort()];
      nsSelect.replaceChildren(...wanted.map((n) => { const o = document.createElement("option"); o.value = n; o.textContent = n || "All namespaces"; return o; }));
      nsSelect.value = wanted.includes(current) ? current : "";
    };
  }

  // ---- details, roots ---------------------------------------------------------------------------------------
  function showDetails(id) {
    const v = vertices.get(id);
    if (!v) return;
    const vx = v.vx;
    const out = [], inn = [];
    for (const a of arcs.values()) {
      if (vid(a.s) === id) out.push(a); else if (vid(a.d) === id) inn.push(a);
    }
    const h = (tag, text, attrs) => { const e = document.createElement(tag); if (text !== undefined) e.textContent = text; Object.assign(e, attrs || {}); return e; };
    const body = [h("h2", vx.n)];
    const dl = h("dl");
    for (const [k, val] of [["Kind", `${vx.r} (${vx.g || "core"}/${vx.v})`], ["Namespace", vx.ns || "(cluster-scoped)"], ["Name", vx.n]]) {
      dl.append(h("dt", k), h("dd", val));
    }
    body.push(dl);
    if (v.j) body.push(h("h3", "JSONPath"), h("pre", v.j.map((x) => (typeof x === "string" ? x : JSON.stringify(x))).join(""), { className: "projection" }));
    else if (v.o) body.push(h("h3", "Object"), h("pre", JSON.stringify(v.o, null, 2), { className: "projection" }));
    const list = (title, items, end) => {
      if (!items.length) return;
      body.push(h("h3", title));
      const ul = h("ul");
      for (const a of items.slice(0, 50)) ul.append(h("li", `${a.t}: ${a[end].r} ${a[end].ns ? a[end].ns + "/" : ""}${a[end].n}`));
      body.push(ul);
    };
    list("Depends on", out, "d");
    list("Used by", inn, "s");
    const btn = h("button", "Show what this depends on", { type: "button", className: "primary", id: "graph-root-button" });
    btn.addEventListener("click", () => { root = id; rootVx = vx; clearRoot.hidden = false; connect(); });
    body.push(btn);
    details.replaceChildren(...body);
  }
  cy.on("tap", "node", (event) => {
    const node = event.target;
    if (node.hasClass("group")) return;
    cy.$("node:selected").unselect();
    node.select();
    showDetails(node.id());
  });

  controls.addEventListener("submit", (event) => { event.preventDefault(); connect(); });
  clearRoot.addEventListener("click", () => { root = null; rootVx = null; clearRoot.hidden = true; connect(); });
  // Keyboard users reach any object by name: select it, centre it, and move focus to its details.
  document.getElementById("graph-find").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = String(new FormData(event.target).get("name") || "").trim().toLowerCase();
    if (!text) return;
    const match = [...vertices.keys()].find((id) => vertices.get(id).vx.n.toLowerCase() === text) ||
      [...vertices.keys()].find((id) => vertices.get(id).vx.n.toLowerCase().includes(text));
    if (!match) { showBanner(`No object named like "${text}" is in the graph.`); return; }
    showBanner("");
    cy.$("node:selected").unselect();
    cy.getElementById(match).select();
    cy.zoom(1.5); cy.center(cy.getElementById(match));
    showDetails(match);
    details.focus();
  });
  document.getElementById("graph-fit").addEventListener("click", () => cy.fit(undefined, 30));

  // For tests and benchmarks: read-only views of the page's state.
  window.tetherGraph = {
    count: () => vertices.size,
    arcs: () => cy.edges().length,
    firstDrawMs: () => firstDrawAt,
    lastDrawMs: () => lastDrawMs,
    timings: () => ({ firstMessageMs, lastMessageMs, lastDrawMs, socketOpenMs }),
    drawnAt: (id) => drawnAt.get(id) || null,
    has: (id) => cy.getElementById(id).nonempty(),
    ids: (resource) => [...vertices.values()].filter((v) => !resource || v.vx.r === resource).map((v) => vid(v.vx)),
    edgesBetween: (s, d) => cy.edges().filter((e) => e.source().id() === s && e.target().id() === d).map((e) => e.classes().join(" ")),
    select: (id) => { const n = cy.getElementById(id); if (n.nonempty()) { cy.$("node:selected").unselect(); n.select(); showDetails(id); } },
    renderedPosition: (id) => cy.getElementById(id).renderedPosition(),
    center: (id) => { cy.zoom(1.5); cy.center(cy.getElementById(id)); },
  };
  // The form can be preset from the address: ?preset=networking&namespace=default&jsonpath=...
  const params = new URLSearchParams(location.search);
  if (params.get("preset") in PRESETS) controls.elements.preset.value = params.get("preset");
  if (params.get("query")) {
    // A resource selector expression of one's own (CEL over group, version, resource, namespaced).
    customQuery = params.get("query");
    const o = document.createElement("option");
    o.value = "custom"; o.textContent = "Custom: " + customQuery;
    controls.elements.preset.append(o);
    controls.elements.preset.value = "custom";
  }
  if (params.get("namespace")) {
    const o = document.createElement("option");
    o.value = o.textContent = params.get("namespace");
    nsSelect.append(o);
    nsSelect.value = params.get("namespace");
  }
  if (params.has("jsonpath")) controls.elements.jsonpath.value = params.get("jsonpath");
  loadNamespaces();
  connect();
})();
