"""PocketWorld: the built-in world of apps (see docs/pocketworld.md).

Kept import-free so that a sandbox worker can import ``proxy`` and ``api`` without the apps,
the generator or the scenarios. Entry points: ``env.PocketWorldEnv``, ``env.PocketWorldSuite``,
``tasks``.
"""
