"""Adapters that run stare_lab's core inside other RL frameworks, each imported only on demand: ``import stare_lab``
never imports a framework. :mod:`stare_lab.integrations.verl` is verl's plugin (docs/integrations-verl.md)."""
