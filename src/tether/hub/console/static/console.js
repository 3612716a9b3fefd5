// Progressive enhancement for the console pages (they work without it): htmx handles boosted links and forms;
// here, confirmation prompts and copying a shown-once token.
(function () {
  "use strict";
  document.addEventListener("htmx:responseError", function (event) {
    // A failed htmx request (e.g. kas unreachable while polling) must not leave the page silently stale.
    const target = event.detail.target;
    if (target && target.id === "connections") {
      target.innerHTML = "";
      const p = document.createElement("p");
      p.className = "warning";
      p.textContent = "Could not refresh the live connections (HTTP " + event.detail.xhr.status + "); retrying.";
      target.append(p);
    }
  });
})();
