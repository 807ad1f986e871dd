// Live updates for a run not finished: the page names its follow
// endpoint; on the first new event, or when the server says that nobody
// drives the run any more or that a driver took it (a liveness event), the
// page reloads itself (the server renders the new steps and who drives the
// run), and the reloaded page follows again.
(function () {
  var url = document.body.getAttribute("data-follow");
  if (!url || !window.EventSource) { return; }
  var source = new EventSource(url);
  var reload = function () { source.close(); window.location.reload(); };
  source.onmessage = reload;
  source.addEventListener("liveness", reload);
  source.addEventListener("error", function () { source.close(); }); // the server gave up: no reconnect loop
})();
