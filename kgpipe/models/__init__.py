"""Models: stateless interactions (:mod:`.interactions`, the ``model.name`` registry), the
model spec stored with every model file (:mod:`.spec`) and the embedding-table model
(:mod:`.model`).

Import from the modules: the interactions sit below the config (which validates model names
against their registry), the model above it.
"""
