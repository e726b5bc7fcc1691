signature-of-b
