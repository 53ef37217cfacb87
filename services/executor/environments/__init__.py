"""Jobs' own Python environments on the local backend (`environment: {pip: [...]}`, docs/environments.md): the
system interpreters they are made from (`pythons.py`), their build with uv, once per content hash and node
(`builder.py`), what the node holds and its removal (`catalog.py`), and all of it for one node (`node.py`)."""
