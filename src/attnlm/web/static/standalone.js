/* Bootstrap of a standalone attention file: mount the views on the embedded record. */
(function () {
  "use strict";
  var record = JSON.parse(document.getElementById("attn-record").textContent);
  var state = JSON.parse(document.getElementById("attn-state").textContent);
  window.attnView = AttnViews.mount(document.getElementById("views"), record, state);
})();
