"""HTTP servers on 127.0.0.1 that the tests script (model endpoints, policy consumers, webhook
receivers). One server class for all of them, so that a burst of connections is queued, not reset."""

from http.server import ThreadingHTTPServer


class LoopbackServer(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: a test that sends 120 requests at once saw
    # connection resets on a loaded machine, and a flaky test, not a bug, went red.
    request_queue_size = 1024
    daemon_threads = True
