"""Resolution and checks of Module DSL programs: constants, scopes, imports, types."""
