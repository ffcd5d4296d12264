"""The commands, one module per group; ``cli.parser`` names each by module (``common.lazy``)."""
