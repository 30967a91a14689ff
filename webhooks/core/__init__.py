"""What the server side shares: the tables, the configuration, the API shapes, the request body
and its signature, outbound HTTP and the metrics."""
