package continuous

import (
	"context"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
)

// NewEventRecorder returns the recorder of Node Events (events.k8s.io),
// sending until ctx ends.
func NewEventRecorder(ctx context.Context, client kubernetes.Interface) events.EventRecorder {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	b.StartRecordingToSink(ctx.Done())
	return b.NewRecorder(scheme.Scheme, "gatehouse-joinservice")
}
