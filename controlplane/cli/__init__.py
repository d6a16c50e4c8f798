"""The `thawpool` command: the server's own commands and the client's."""
