"""What AI-READI is: participant IDs, the label table, DICOM reading, and the synthetic twins.

Nothing here knows about the cache or the trainer: the audit and the build both read the dataset
through these modules.
"""
