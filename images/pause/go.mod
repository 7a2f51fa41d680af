module shadow-operator.local/images/pause

go 1.24
