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
  /* Arriving at an anomaly (from the timeline, the checker table or a link) opens its story. */
  function openStory() {
    var target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
    /* An anomaly in a closed group: open the group first. */
    var group = target && target.closest("details.anomaly-group");
    if (group && !group.open) {
      group.open = true;
      target.scrollIntoView();
    }
    var story = target && (target.matches("details.story") ? target : target.querySelector("details.story"));
    if (story) {
      story.open = true;
    }
  }
  window.addEventListener("hashchange", openStory);
  openStory();
  var svg = document.getElementById("timeline-svg");
  var marker = document.createElement("div");
  marker.id = "rendered";
  marker.hidden = true;
  marker.setAttribute("data-svg-elements", svg ? String(svg.getElementsByTagName("*").length + 1) : "0");
  /* For the tests: each plot's element count and drawn size, and the open story as rendered. */
  var plots = document.querySelectorAll("svg.plot");
  var drawn = [];
  for (var i = 0; i < plots.length; i++) {
    var box = plots[i].getBBox();
    drawn.push(plots[i].id + ":" + (plots[i].getElementsByTagName("*").length + 1) + ":" +
      Math.round(box.width) + "x" + Math.round(box.height));
  }
  marker.setAttribute("data-plots", drawn.join(" "));
  /* For the tests: the zoomed timeline's lanes and drawn size, when the page has one. */
  var zoom = document.getElementById("timeline-zoom-svg");
  if (zoom) {
    var zbox = zoom.getBBox();
    marker.setAttribute("data-zoom", zoom.querySelectorAll("g.lane").length + ":" +
      Math.round(zbox.width) + "x" + Math.round(zbox.height));
  }
  var open = document.querySelector("details.story[open]");
  if (open) {
    var mini = open.querySelector("svg.mini");
    var mbox = mini ? mini.getBBox() : { width: 0, height: 0 };
    marker.setAttribute("data-story", open.id + ":" + open.querySelectorAll("ol.story-steps li").length + ":" +
      open.querySelector("ol.story-steps").offsetHeight + ":" + Math.round(mbox.width) + "x" + Math.round(mbox.height));
  }
  /* Each plot saves as a picture of its own: the SVG with the page's styles inside it. */
  function standalone(svg) {
    var copy = svg.cloneNode(true);
    copy.setAttribute("xmlns", svg.namespaceURI);
    copy.removeAttribute("style");
    var style = document.createElementNS(svg.namespaceURI, "style");
    style.textContent = Array.prototype.map.call(document.querySelectorAll("head style"), function (s) {
      return s.textContent;
    }).join("\n");
    copy.insertBefore(style, copy.firstChild);
    return new XMLSerializer().serializeToString(copy);
  }
  var saves = document.querySelectorAll("button.save-plot");
  for (var k = 0; k < saves.length; k++) {
    saves[k].addEventListener("click", function (event) {
      var id = event.currentTarget.getAttribute("data-plot");
      var svg = document.getElementById(id);
      if (!svg) {
        return;
      }
      var link = document.createElement("a");
      link.href = URL.createObjectURL(new Blob([standalone(svg)], { type: "image/svg+xml" }));
      link.download = id + ".svg";
      document.body.appendChild(link);
      link.click();
      link.remove();
    });
  }
  /* For the tests: the first plot as it would be saved, parsed back on its own. */
  var first = document.querySelector("svg.plot");
  if (first) {
    var parsed = new DOMParser().parseFromString(standalone(first), "image/svg+xml");
    var ok = !parsed.querySelector("parsererror") && parsed.documentElement.localName === "svg" &&
      parsed.querySelector("style") !== null;
    marker.setAttribute("data-saved-plot", (ok ? "svg:" : "broken:") + parsed.documentElement.childElementCount);
  }
  document.body.appendChild(marker);
})();
