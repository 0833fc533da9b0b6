"""The parts of the choose-layout pass (:mod:`passes.choose_layout`): placement state and planners."""
