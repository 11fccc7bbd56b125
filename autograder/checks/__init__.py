"""Hidden-test checks, one module per notebook (nb01, nb02, ...), built on `core`."""
