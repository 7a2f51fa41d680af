module shadow-operator.local/images/kindnetd

go 1.24
