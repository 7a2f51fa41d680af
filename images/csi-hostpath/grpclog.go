package main

import (
	"context"
	"log"

	"google.golang.org/grpc"
)

// logErrors logs every failed call: the sidecars only show the error on the Kubernetes object.
func logErrors(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err != nil {
		log.Printf("%s: %v", info.FullMethod, err)
	}
	return resp, err
}
