signature-of-a
