"""`teola bench --serve-overload`: `teola serve` under twice the load it can take (see `bench`)."""
