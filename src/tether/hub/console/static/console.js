// Progressive enhancement for the console pages (they work without it): htmx handles boosted links and forms;
// here, a failed refresh of a live region is said in the page.
(function () {
  "use strict";
  const LIVE = { connections: "the live connections", "workspaces-live": "the workspaces" };
  document.addEventListener("htmx:responseError", function (event) {
    // A failed htmx request (e.g. kas unreachable while polling) must not leave the page silently stale.
    const target = event.detail.target;
    const what = target && LIVE[target.id];
    if (!what) {
      return;
    }
    if (target.id === "connections") {
      target.innerHTML = ""; // connections from before may be gone: show none rather than stale ones
    }
    // Workspaces keep their last list (their buttons still work); the next good answer replaces the warning.
    let warning = target.querySelector(":scope > p.refresh-warning");
    if (!warning) {
      warning = document.createElement("p");
      warning.className = "warning refresh-warning";
      target.prepend(warning);
    }
    warning.textContent = "Could not refresh " + what + " (HTTP " + event.detail.xhr.status + "); retrying.";
  });
})();
