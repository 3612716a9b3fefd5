// Replays a recorded exec/attach session with asciinema-player (vendored from npm). The player starts at once and
// the element's data-state says "playing" then "ended", so that a test (or a reader) knows when it is done.
"use strict";
(function () {
  const element = document.getElementById("recording-player");
  if (!element || !window.AsciinemaPlayer) {
    return;
  }
  const player = window.AsciinemaPlayer.create(element.dataset.cast, element, {
    autoPlay: true,
    fit: "width",
    idleTimeLimit: 1,
    terminalFontSize: "medium",
  });
  player.addEventListener("playing", () => {
    element.dataset.state = "playing";
  });
  player.addEventListener("ended", () => {
    element.dataset.state = "ended";
  });
  player.addEventListener("error", () => {
    element.dataset.state = "error";
  });
})();
