package admin

import "github.com/danielgtaylor/huma/v2"

func (s *server) registerSchedules(api huma.API)   {}
func (s *server) registerOutbox(api huma.API)      {}
func (s *server) registerIdempotency(api huma.API) {}
