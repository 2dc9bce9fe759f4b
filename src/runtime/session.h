/* A session's insides, shared by the session API and generation. */
#ifndef G4_RUNTIME_SESSION_H
#define G4_RUNTIME_SESSION_H
#include "g4.h"
#include "model/forward.h"
#include "util/threadpool.h"

struct g4_session {
    g4_model *m;
    g4_threadpool *pool;
    g4_state st;
};
#endif
