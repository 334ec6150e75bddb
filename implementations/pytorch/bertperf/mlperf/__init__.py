"""MLPerf logging and the official checkers."""
