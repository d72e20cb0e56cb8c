(function () {
  "use strict";
  var button = document.getElementById("copy");
  var code = document.getElementById("command");
  if (button && code) {
    button.addEventListener("click", function () {
      var range = document.createRange();
      range.selectNodeContents(code);
      var selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      if (navigator.clipboard) {
        navigator.clipboard.writeText(code.textContent).then(function () {
          button.textContent = "copied";
        }, function () {});
      }
    });
  }
  var svg = document.getElementById("timeline-svg");
  var marker = document.createElement("div");
  marker.id = "rendered";
  marker.hidden = true;
  marker.setAttribute("data-svg-elements", svg ? String(svg.getElementsByTagName("*").length + 1) : "0");
  document.body.appendChild(marker);
})();
