"""`make discover`: read a machine's facts and write the host profile that fits it."""
