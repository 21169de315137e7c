# CPACK_PRE_BUILD_SCRIPTS: runs after CPack installed each component into its staging tree
# and before the package is made.  The debs are left as they are; the rpms lose what only
# Debian reads and gain what Fedora/Rocky need (the list at the top of CMakeLists.txt).
if(NOT CPACK_GENERATOR STREQUAL "RPM")
  return()
endif()
foreach(_fl_comp IN LISTS CPACK_COMPONENTS_ALL)
  set(_fl_root "${CPACK_TEMPORARY_INSTALL_DIRECTORY}/${_fl_comp}")
  file(REMOVE_RECURSE "${_fl_root}/usr/share/lintian")
  if(_fl_comp STREQUAL "client")
    # ld.so searches /usr/lib64, not /usr/lib, on 64-bit Fedora/Rocky.
    file(WRITE "${_fl_root}/etc/ld.so.conf.d/framelink.conf"
         "# libframelink0: libframelink.so.0 is installed in /usr/lib\n/usr/lib\n")
  endif()
endforeach()
