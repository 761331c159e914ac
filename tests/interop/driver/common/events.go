package common

import (
	"encoding/json"
	"os"
	"sync"
	"time"
)

var emitMu sync.Mutex

// Emit writes one JSON event line to stdout. Tests read these lines to learn what the
// driver did (ready, calls received, streams opened and closed, reports sent).
func Emit(event string, fields map[string]any) {
	line := map[string]any{"event": event, "time": float64(time.Now().UnixNano()) / 1e9}
	for k, v := range fields {
		line[k] = v
	}
	data, err := json.Marshal(line)
	if err != nil {
		data = []byte(`{"event":"emit_error"}`)
	}
	emitMu.Lock()
	defer emitMu.Unlock()
	_, _ = os.Stdout.Write(append(data, '\n'))
}
