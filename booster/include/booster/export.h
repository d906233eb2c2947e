// export.h — the one symbol-visibility macro of Booster C++.
// Everything is built with -fvisibility=hidden; BOOSTER_API marks what the core library exports.
#pragma once

#if defined(_WIN32)
#define BOOSTER_API __declspec(dllexport)
#else
#define BOOSTER_API __attribute__((visibility("default")))
#endif
