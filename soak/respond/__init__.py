"""The response to an incident: evidence bundle (``evidence``), SIGKILL of the
target's tree through ``soak.proc``, a bounded wait for the GPUs to be free
(``gpu``), the flight recorder (``flight``) and the stop/restart policy
(``policy``); ``responder.Responder`` runs them in order."""
