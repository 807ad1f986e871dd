// Live updates for a run still in progress: the page names its follow
// endpoint; on the first new event the page reloads itself (the server
// renders the new steps), and the reloaded page follows again.
(function () {
  var url = document.body.getAttribute("data-follow");
  if (!url || !window.EventSource) { return; }
  var source = new EventSource(url);
  source.onmessage = function () { source.close(); window.location.reload(); };
  source.addEventListener("error", function () { source.close(); }); // the server gave up: no reconnect loop
})();
